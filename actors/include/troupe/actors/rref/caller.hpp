#pragma once
/// \file caller.hpp
/// Which worker's call an executor thread is serving right now. The agent sets it around every
/// user function; the RRef layer uses it to know where an RRef inside a result goes, so it can
/// probe for a lost reply (Note [RRef protocol], lost carriers).

#include <string>

namespace troupe::rref_detail {

/// The caller of the function running on this thread, or an empty string.
const std::string& current_caller();

/// Sets current_caller() for a scope (the agent, around a user function).
class caller_scope {
 public:
  explicit caller_scope(const std::string& caller);
  ~caller_scope();
  caller_scope(const caller_scope&) = delete;
  caller_scope& operator=(const caller_scope&) = delete;

 private:
  const std::string* previous_;
};

}  // namespace troupe::rref_detail
