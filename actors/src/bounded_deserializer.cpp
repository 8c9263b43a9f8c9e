// Note [bounded CAF reader] (bounded_deserializer.hpp).
#include "bounded_deserializer.hpp"

#include <caf/actor_system.hpp>

#include "troupe/actors/error_caf.hpp"

namespace troupe::detail {

bounded_deserializer::bounded_deserializer(caf::execution_unit* ctx, const char* data, std::size_t n)
    : caf::deserializer(ctx), in_(ctx, data, n) {}

bounded_deserializer::bounded_deserializer(caf::actor_system& sys, const std::vector<char>& buf)
    : caf::deserializer(sys), in_(sys, buf) {}

caf::error bounded_deserializer::begin_sequence(size_t& num) {
  if (auto err = in_.begin_sequence(num)) return err;
  if (num <= in_.remaining()) return {};
  violation_ = "a sequence of " + std::to_string(num) + " elements is longer than the " + std::to_string(in_.remaining()) +
               " bytes left";
  num = 0;  // nothing is allocated for it, whatever the caller does with the error
  return to_caf_error(errc::protocol_violation, violation_);
}

}  // namespace troupe::detail
