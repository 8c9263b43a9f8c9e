// The launch board of the bucket actors (Note [bucket actor]).
#include "launch_board.hpp"

namespace troupe::ddp::detail {

void launch_board::open(std::size_t buckets) {
  std::lock_guard<std::mutex> lock(mu_);
  slots_.assign(buckets, std::nullopt);
  launched_at_.assign(buckets, {});
  order_.clear();
}

void launch_board::fill(int bucket, comm_result result, clock::time_point launched_at) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    const auto b = static_cast<std::size_t>(bucket);
    if (b >= slots_.size()) return;  // a round opened for fewer buckets: nobody waits for it
    slots_[b] = std::move(result);
    launched_at_[b] = launched_at;
    order_.push_back(bucket);
  }
  cv_.notify_all();
}

std::optional<std::vector<std::optional<comm_result>>> launch_board::wait_filled(std::size_t count,
                                                                                   std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return order_.size() >= count; })) return std::nullopt;
  return slots_;
}

std::vector<std::optional<comm_result>> launch_board::slots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slots_;
}

std::size_t launch_board::filled() const {
  std::lock_guard<std::mutex> lock(mu_);
  return order_.size();
}

std::vector<int> launch_board::order() const {
  std::lock_guard<std::mutex> lock(mu_);
  return order_;
}

std::vector<launch_board::clock::time_point> launch_board::launched_at() const {
  std::lock_guard<std::mutex> lock(mu_);
  return launched_at_;
}

}  // namespace troupe::ddp::detail
