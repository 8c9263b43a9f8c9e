#pragma once
// The shared state behind a process group's `work` handle: completed once by the group's worker.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "troupe/ddp/process_group.hpp"

namespace troupe::ddp {

struct work::state {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::optional<troupe::error> err;
  std::string description;
  std::function<void()> body;
  bool breaks_group = true;
  std::chrono::steady_clock::time_point finished_at;

  /// Set for a work that a device completes (an NCCL stream) instead of a CPU group's worker:
  /// wait, is_completed, error and synchronize_stream delegate to it, and `done` stays false.
  struct device_completion {
    std::function<void(std::chrono::milliseconds)> wait;  // throws like work::wait
    std::function<bool()> poll;                           // true once finished (either way)
    std::function<std::optional<troupe::error>()> error;
    std::function<void()> synchronize_stream;
  };
  std::optional<device_completion> device;

  void finish(std::optional<troupe::error> e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      finished_at = std::chrono::steady_clock::now();
      err = std::move(e);
      body = nullptr;  // releases the tensors
    }
    cv.notify_all();
  }
};

namespace detail {
/// A work that already failed with `e` (a check refused the collective before it started).
inline work failed_work(std::string description, troupe::error e) {
  auto s = std::make_shared<work::state>();
  s->description = std::move(description);
  s->finish(std::move(e));
  return work(std::move(s));
}
}  // namespace detail

}  // namespace troupe::ddp
