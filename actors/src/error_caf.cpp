#include "troupe/actors/error_caf.hpp"

#include <caf/actor_system_config.hpp>
#include <caf/make_message.hpp>
#include <caf/sec.hpp>

namespace troupe {

caf::error to_caf_error(errc code, const std::string& message) {
  return caf::error(static_cast<std::uint8_t>(code), troupe_error_atom::value, caf::make_message(message));
}

caf::error to_caf_error(const error& e) { return to_caf_error(e.code(), e.message()); }

error from_caf_error(const caf::error& e, const std::string& what) {
  // An empty caf::error (a normal exit's reason, say) has no category to read.
  if (!e) return error(errc::invalid_state, what + ": no error (normal exit)");
  if (e.category() == troupe_error_atom::value) {
    std::string msg;
    if (e.context().match_elements<std::string>()) msg = e.context().get_as<std::string>(0);
    return error(static_cast<errc>(e.code()), msg);
  }
  errc code = errc::protocol_violation;
  if (e.category() == caf::atom("system")) {
    const auto s = static_cast<caf::sec>(e.code());
    if (s == caf::sec::request_timeout) code = errc::timeout;
    else if (s == caf::sec::remote_linking_failed || s == caf::sec::cannot_connect_to_node) code = errc::peer_lost;
  }
  return error(code, what + ": " + caf::to_string(e));
}

void register_error_category(caf::actor_system_config& cfg) {
  cfg.add_error_category(troupe_error_atom::value, [](std::uint8_t code, caf::atom_value, const caf::message& ctx) {
    std::string out = "troupe::" + std::string(to_string(static_cast<errc>(code)));
    if (ctx.match_elements<std::string>()) out += ": " + ctx.get_as<std::string>(0);
    return out;
  });
}

}  // namespace troupe
