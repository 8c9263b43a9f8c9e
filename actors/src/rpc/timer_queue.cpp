// Timers of the direct channel's I/O thread (rpc/timer_queue.hpp).
#include "rpc/timer_queue.hpp"

#include <algorithm>

namespace troupe::detail {

void timer_queue::add(clock::time_point at, std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mutex_);
  timers_.emplace(at, std::move(fn));
}

void timer_queue::run_due() {
  for (;;) {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (timers_.empty() || timers_.begin()->first > clock::now()) return;
      fn = std::move(timers_.begin()->second);
      timers_.erase(timers_.begin());
    }
    fn();
  }
}

timer_queue::clock::time_point timer_queue::next(clock::time_point bound) {
  std::lock_guard<std::mutex> lock(mutex_);
  return timers_.empty() ? bound : std::min(bound, timers_.begin()->first);
}

void timer_queue::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  timers_.clear();
}

}  // namespace troupe::detail
