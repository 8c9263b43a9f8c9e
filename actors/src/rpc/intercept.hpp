#pragma once
// Runtime side of Note [call interceptor] (troupe/actors/rpc/interceptor.hpp). It holds the
// interceptor of a node. It tells an exception thrown by the interceptor apart from the call's
// own errors.

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "troupe/actors/rpc/interceptor.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::rpc::detail {

/// An exception thrown by an interceptor, rethrown as a troupe::error. It keeps the code of a
/// troupe::error (anything else becomes invalid_state) and prefixes where it happened. The callee
/// answers it as remote_exception; the caller's future carries it.
class interceptor_failure : public error {
 public:
  using error::error;
};

/// Runs `f` (a call into the interceptor named by `where`); rethrows what it throws as an
/// interceptor_failure.
template <class F>
decltype(auto) guarded(const char* where, F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const interceptor_failure&) {
    throw;
  } catch (const error& e) {
    throw interceptor_failure(e.code(), std::string("call interceptor (") + where + "): " + e.message());
  } catch (const std::exception& e) {
    throw interceptor_failure(errc::invalid_state, std::string("call interceptor (") + where + "): " + e.what());
  } catch (...) {
    throw interceptor_failure(errc::invalid_state, std::string("call interceptor (") + where + "): unknown exception");
  }
}

/// The interceptor slot of one node, shared by the node and its agent. Thread-safe.
class interceptor_slot {
 public:
  void set(std::shared_ptr<call_interceptor> ic) {
    std::lock_guard<std::mutex> lock(mutex_);
    ic_ = std::move(ic);
    installed_.store(ic_ != nullptr, std::memory_order_release);
  }
  std::shared_ptr<call_interceptor> get() const {
    if (!installed_.load(std::memory_order_acquire)) return nullptr;  // every call asks: no lock when none is set
    std::lock_guard<std::mutex> lock(mutex_);
    return ic_;
  }

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<call_interceptor> ic_;
  std::atomic<bool> installed_{false};
};

}  // namespace troupe::rpc::detail
