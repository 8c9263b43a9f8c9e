#pragma once
// The executor: a fixed pool of threads running user RPC functions and future continuations,
// never on CAF scheduler threads (DESIGN.md: user code never blocks inside an actor).

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe::detail {

class executor {
 public:
  explicit executor(int threads);
  ~executor();
  executor(const executor&) = delete;
  executor& operator=(const executor&) = delete;

  /// Queues a job; returns false (and drops it) after stop().
  bool post(std::function<void()> job);
  /// Lets queued jobs finish, then joins the threads. Idempotent. Must not be called from a pool
  /// thread.
  void stop();

 private:
  void run();
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace troupe::detail
