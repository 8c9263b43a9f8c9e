// A periodic worker thread (periodic_thread.hpp).
#include "periodic_thread.hpp"

namespace troupe::ddp::detail {

periodic_thread::periodic_thread(std::chrono::milliseconds interval, std::function<void()> tick)
    : interval_(interval), tick_(std::move(tick)), thread_([this] { run(); }) {}

periodic_thread::~periodic_thread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void periodic_thread::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, interval_, [&] { return stop_; })) {
    lock.unlock();
    try {
      tick_();
    } catch (...) {
      // a failing step is retried at the next tick
    }
    lock.lock();
  }
}

}  // namespace troupe::ddp::detail
