#include "shutdown_hooks.hpp"

#include <utility>
#include <vector>


namespace troupe::detail {

std::uint64_t shutdown_hooks::add(std::function<void()> stop) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ran_) return 0;
  const std::uint64_t id = next_++;
  stops_.emplace(id, std::move(stop));
  return id;
}

void shutdown_hooks::remove(std::uint64_t id) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stops_.erase(id);
  }
  std::lock_guard<std::recursive_mutex> wait(running_);  // a running stop function finishes first
}

void shutdown_hooks::run_all() noexcept {
  std::lock_guard<std::recursive_mutex> running(running_);
  std::vector<std::function<void()>> stops;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ran_) return;
    ran_ = true;
    for (auto& [id, stop] : stops_) stops.push_back(std::move(stop));
    stops_.clear();
  }
  for (auto& stop : stops) {
    try {
      stop();
    } catch (...) {  // Note [shutdown hooks]: stop functions must not throw
    }
  }
}

}  // namespace troupe::detail
