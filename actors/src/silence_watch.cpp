// The watch for silent peers (Note [silent peers] in silence_watch.hpp).
#include "silence_watch.hpp"

#include <algorithm>

namespace troupe::detail {

silence_watch::silence_watch(std::string self, std::shared_ptr<transport_hook> hook, std::chrono::milliseconds timeout, peer_list peers,
                             declare lost)
    : self_(std::move(self)), hook_(std::move(hook)), timeout_(timeout), peers_(std::move(peers)), lost_(std::move(lost)) {
  thread_ = std::thread([this] { run(); });
}

silence_watch::~silence_watch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void silence_watch::run() {
  const auto period = std::clamp(timeout_ / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(250));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, period, [this] { return stop_; })) {
    lock.unlock();
    check();
    lock.lock();
  }
}

void silence_watch::check() {
  const auto now = std::chrono::steady_clock::now();
  for (const auto& peer : peers_()) {
    const auto since = hook_->silent_since(peer, self_);
    if (!since || now - *since < timeout_) continue;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now - *since).count();
    lost_(peer, "silent for " + std::to_string(ms) + " ms, past the peer timeout of " + std::to_string(timeout_.count()) + " ms (fault plan)");
  }
}

}  // namespace troupe::detail
