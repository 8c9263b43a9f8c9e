#pragma once
// Work to run at a later time on the direct channel's I/O thread. That is a response or
// request held back by the transport hook (a delay of the fault plan), or a send the hook
// delayed.

#include <chrono>
#include <functional>
#include <map>
#include <mutex>

namespace troupe::detail {

/// Timers ordered by due time. add() and next() from any thread; run_due() from the one thread
/// that runs them. Thread-safe.
class timer_queue {
 public:
  using clock = std::chrono::steady_clock;

  /// Runs `fn` at or after `at`, when run_due() next runs.
  void add(clock::time_point at, std::function<void()> fn);
  /// Runs every timer due by now, earliest first, outside the lock (a timer may add another).
  void run_due();
  /// The earliest due time, or `bound` when that is earlier or nothing is queued.
  clock::time_point next(clock::time_point bound);
  /// Drops every queued timer without running it.
  void clear();

 private:
  std::mutex mutex_;
  std::multimap<clock::time_point, std::function<void()>> timers_;
};

}  // namespace troupe::detail
