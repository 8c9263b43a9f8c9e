// scope_guard (Note [call interceptor] in rpc/interceptor.hpp).
#include "troupe/actors/rpc/interceptor.hpp"

namespace troupe::rpc {

scope_guard::scope_guard(call_scope* s) : scope_(s) {
  if (scope_) scope_->enter();
}

scope_guard::~scope_guard() {
  if (!scope_) return;
  try {
    scope_->leave();
  } catch (...) {
    // A destructor never throws.
  }
}

}  // namespace troupe::rpc
