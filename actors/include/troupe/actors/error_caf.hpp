#pragma once
/// \file error_caf.hpp
/// troupe::error <-> caf::error. Troupe errors travel as a caf::error of category `troupe`.
/// Its code is the `errc` value and its context holds the message. So the code and the message
/// survive the wire unchanged.

#include <caf/atom.hpp>
#include <caf/error.hpp>

#include "troupe/tensors/error.hpp"

namespace caf {
class actor_system_config;
}

namespace troupe {

/// The CAF error category of Troupe errors.
using troupe_error_atom = caf::atom_constant<caf::atom("troupe")>;

/// Wraps a troupe::error as a caf::error (category `troupe`, context = the message).
caf::error to_caf_error(const error& e);
/// Wraps a code and message as a caf::error.
caf::error to_caf_error(errc code, const std::string& message);

/// Converts a caf::error back. A `troupe` category error keeps its code and message. CAF system
/// errors map to the nearest code: request_timeout -> timeout, remote_link_unreachable ->
/// peer_lost, anything else -> protocol_violation. Their rendered text gets `what` as a prefix.
/// An empty caf::error (no error, e.g. a normal exit's reason) becomes invalid_state saying so.
error from_caf_error(const caf::error& e, const std::string& what);

/// Registers the `troupe` error category renderer with a config (called by register_messages).
void register_error_category(caf::actor_system_config& cfg);

}  // namespace troupe
