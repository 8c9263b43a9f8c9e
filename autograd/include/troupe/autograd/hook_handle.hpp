#pragma once
/// \file hook_handle.hpp
/// The handle returned by every hook registration (tensor hooks, node pre/post hooks,
/// post-accumulate-grad hooks).

#include <functional>
#include <utility>

namespace troupe {

/// Removes a registered hook on `remove()`. Destroying the handle does NOT remove the hook (as
/// PyTorch's RemovableHandle): keep the handle only if you want to remove the hook later.
/// The handle stays safe to use after the hooked tensor or node is gone (it holds weak refs).
class hook_handle {
 public:
  /// An inactive handle.
  hook_handle() = default;
  /// A handle whose `remove()` runs `remover` once.
  explicit hook_handle(std::function<void()> remover) : remover_(std::move(remover)) {}

  /// Removes the hook; idempotent. Does not block (beyond a short lock of the hooked object).
  void remove() {
    auto r = std::exchange(remover_, nullptr);
    if (r) r();
  }
  /// True until `remove()` was called (false for a default-constructed handle).
  bool active() const noexcept { return static_cast<bool>(remover_); }

 private:
  std::function<void()> remover_;
};

}  // namespace troupe
