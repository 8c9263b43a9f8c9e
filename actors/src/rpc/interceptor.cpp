// The per-thread stack of active call scopes (Note [call interceptor] in rpc/interceptor.hpp).
#include "troupe/actors/rpc/interceptor.hpp"

#include <utility>

namespace troupe::rpc {

namespace {
// The top of this thread's stack; each guard remembers the scope below it.
thread_local call_scope* tls_top = nullptr;
}  // namespace

call_scope* active_scope() { return tls_top; }

scope_guard::scope_guard(call_scope* s) : scope_(s), previous_(tls_top) {
  if (!scope_) return;
  tls_top = scope_;
  try {
    scope_->enter();
  } catch (...) {
    tls_top = previous_;
    throw;
  }
}

scope_guard::~scope_guard() {
  if (!scope_) return;
  try {
    scope_->leave();
  } catch (...) {
    // A destructor never throws; the scope is popped regardless.
  }
  tls_top = previous_;
}

hide_scope::hide_scope() : previous_(std::exchange(tls_top, nullptr)) {}
hide_scope::~hide_scope() { tls_top = previous_; }

}  // namespace troupe::rpc
