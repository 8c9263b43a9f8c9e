#pragma once
// A thread that writes large frames of the direct channel in the background (Note [fragments]
// in rpc/fragment.hpp). So rpc_async of a tensor sent as bytes returns once the request is
// encoded, not once 64 MB went through the socket. An executor thread answering with one is
// free again at once. The payload is the message's own encoded copy, so the caller may change
// its tensor as soon as the call returns. A frame that borrows its tensors' bytes is never
// queued here: its sender writes it (Note [borrowed tensor bytes] in rpc/borrowed_parts.hpp).
//
// Started on first use, so a node that never sends such a frame has no extra thread. Writes run
// in the order they were queued. stop() runs what is queued (a closed connection makes each write
// fail at once) and joins; later writes run on the calling thread. A write must not call stop()
// (the direct channel stops it before it goes).

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace troupe::detail {

class frame_writer {
 public:
  frame_writer() = default;
  ~frame_writer() { stop(); }
  frame_writer(const frame_writer&) = delete;
  frame_writer& operator=(const frame_writer&) = delete;

  /// Queues `write` (it must not throw).
  void post(std::function<void()> write) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!stopped_) {
        queue_.push_back(std::move(write));
        if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
        cv_.notify_one();
        return;
      }
    }
    write();
  }

  /// Runs what is queued and joins the thread. Idempotent.
  void stop() {
    std::thread t;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopped_ = true;
      t = std::move(thread_);
    }
    cv_.notify_one();
    if (t.joinable()) t.join();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      cv_.wait(lock, [this] { return stopped_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopped, nothing left
      auto w = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      w();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::thread thread_;
  bool stopped_ = false;
};

}  // namespace troupe::detail
