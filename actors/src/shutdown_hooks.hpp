#pragma once
// The stop functions a node runs before its actor system goes down (Note [shutdown hooks]).

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

namespace troupe::detail {

/// Thread-safe. run_all() runs once; add() after it returns 0 (the node is shut down).
class shutdown_hooks {
 public:
  /// Registers `stop`; its id (never 0), or 0 once run_all() has begun.
  std::uint64_t add(std::function<void()> stop);
  /// Unregisters `id`; waits while a run_all() on another thread runs functions.
  void remove(std::uint64_t id) noexcept;
  /// Runs every registered function once, in registration order; exceptions are swallowed.
  void run_all() noexcept;

 private:
  std::mutex mu_;
  std::map<std::uint64_t, std::function<void()>> stops_;  // under mu_
  std::uint64_t next_ = 1;                                 // under mu_
  bool ran_ = false;                                       // under mu_
  std::recursive_mutex running_;  // held by run_all(); a stop function may remove its own hook
};

}  // namespace troupe::detail
