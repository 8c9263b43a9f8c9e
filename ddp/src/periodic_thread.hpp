#pragma once
// A thread that runs one step periodically until it is destroyed: the NCCL group's watchdog.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace troupe::ddp::detail {

/// Runs `tick` on its own thread every `interval` until destroyed (RAII: the destructor stops
/// and joins it, waiting at most for one running tick). An exception thrown by `tick` is
/// dropped; the next tick still runs.
class periodic_thread {
 public:
  periodic_thread(std::chrono::milliseconds interval, std::function<void()> tick);
  ~periodic_thread();
  periodic_thread(const periodic_thread&) = delete;
  periodic_thread& operator=(const periodic_thread&) = delete;

 private:
  void run();

  std::chrono::milliseconds interval_;
  std::function<void()> tick_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace troupe::ddp::detail
