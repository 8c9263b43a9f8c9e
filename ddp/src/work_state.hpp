#pragma once
// The shared state behind a process group's `work` handle: completed once by the group's worker.

#include <chrono>
#include <condition_variable>
#include <functional>
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

}  // namespace troupe::ddp
