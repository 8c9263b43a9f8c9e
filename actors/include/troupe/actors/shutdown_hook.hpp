#pragma once
// A stop function that node::shutdown() runs before the node's actor system goes down.
//
// Note [shutdown hooks]
// ---------------------
// A layer whose actors live on node::system() (DDP's bucket actors, for one) registers a stop
// function with node::at_shutdown(). The node's teardown runs every registered function first.
// They run on the thread that shuts the node down, while the actor system still runs. Each
// stops its layer's actors and leaves that layer refusing further work with invalid_state. So
// shutting the node down while such an object still exists is safe, in any order.
//
// The handle unregisters on destruction. A destruction that races with the stop function waits
// until it has returned, so the function never runs on a destroyed object. Stop functions must
// not throw (an exception is swallowed) and must bound their waits.

#include <cstdint>
#include <memory>

namespace troupe {

namespace detail {
class shutdown_hooks;
}

/// Registration of one stop function (Note [shutdown hooks]). Move-only RAII.
class shutdown_hook {
 public:
  shutdown_hook() = default;
  shutdown_hook(std::weak_ptr<detail::shutdown_hooks> hooks, std::uint64_t id);
  /// Unregisters; waits while the function runs on another thread. Never throws.
  ~shutdown_hook();
  shutdown_hook(shutdown_hook&& other) noexcept;
  shutdown_hook& operator=(shutdown_hook&& other) noexcept;
  shutdown_hook(const shutdown_hook&) = delete;
  shutdown_hook& operator=(const shutdown_hook&) = delete;

  /// Unregisters now (as the destructor). Idempotent.
  void reset() noexcept;

 private:
  std::weak_ptr<detail::shutdown_hooks> hooks_;
  std::uint64_t id_ = 0;
};

}  // namespace troupe
