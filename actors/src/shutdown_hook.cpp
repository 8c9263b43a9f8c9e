#include "troupe/actors/shutdown_hook.hpp"

#include <utility>

#include "shutdown_hooks.hpp"

namespace troupe {

shutdown_hook::shutdown_hook(std::weak_ptr<detail::shutdown_hooks> hooks, std::uint64_t id) : hooks_(std::move(hooks)), id_(id) {}

shutdown_hook::~shutdown_hook() { reset(); }

shutdown_hook::shutdown_hook(shutdown_hook&& other) noexcept : hooks_(std::move(other.hooks_)), id_(std::exchange(other.id_, 0)) {}

shutdown_hook& shutdown_hook::operator=(shutdown_hook&& other) noexcept {
  if (this != &other) {
    reset();
    hooks_ = std::move(other.hooks_);
    id_ = std::exchange(other.id_, 0);
  }
  return *this;
}

void shutdown_hook::reset() noexcept {
  if (id_ == 0) return;
  if (auto hooks = hooks_.lock()) hooks->remove(id_);
  id_ = 0;
  hooks_.reset();
}

}  // namespace troupe
