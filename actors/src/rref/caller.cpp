// current_caller() (rref/caller.hpp).
#include "troupe/actors/rref/caller.hpp"

namespace troupe::rref_detail {

namespace {
thread_local const std::string* tls_caller = nullptr;
const std::string no_caller;
}  // namespace

const std::string& current_caller() { return tls_caller ? *tls_caller : no_caller; }
caller_scope::caller_scope(const std::string& caller) : previous_(tls_caller) { tls_caller = &caller; }
caller_scope::~caller_scope() { tls_caller = previous_; }

}  // namespace troupe::rref_detail
