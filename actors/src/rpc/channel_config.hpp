#pragma once
// What the direct channel needs from its node (Note [direct channel] in rpc/direct_channel.hpp).

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <caf/node_id.hpp>

#include "executor.hpp"
#include "rpc/bulk.hpp"
#include "rpc/intercept.hpp"
#include "rpc/wire.hpp"
#include "troupe/actors/flight_recorder.hpp"
#include "troupe/actors/rpc/registry.hpp"
#include "troupe/actors/transport.hpp"
#include "troupe/actors/worker_info.hpp"

namespace troupe::detail {

class tls_relays;

/// What the direct channel needs from its node.
struct direct_channel_config {
  worker_info me;
  caf::node_id my_node;
  std::string listen_addr;
  std::shared_ptr<rpc::registry> functions;
  std::shared_ptr<executor> exec;
  std::shared_ptr<bulk_names> bulk;
  std::shared_ptr<transport_hook> hook;
  std::shared_ptr<rpc::detail::interceptor_slot> interceptor;
  /// Note [connection hygiene] (rpc/accept_guard.hpp).
  std::chrono::milliseconds auth_deadline{2000};
  std::size_t max_unauthenticated = 64;
  /// The node's recorder (Note [flight recorder]): served calls are recorded there.
  flight_recorder* recorder = nullptr;
  /// node_options::max_message_bytes: the largest frame body or fragmented total a peer may announce.
  std::uint64_t max_message_bytes = max_frame_body;
  /// Note [tls relay]: with TLS, every connection goes through a relay; null: plain TCP.
  std::shared_ptr<tls_relays> tls;
};

/// The largest frame body (or fragmented total) sent or accepted: cfg.max_message_bytes within
/// [min_message_bytes, max_frame_body].
inline std::uint32_t channel_max_body(const direct_channel_config& cfg) {
  return static_cast<std::uint32_t>(std::clamp<std::uint64_t>(cfg.max_message_bytes, min_message_bytes, max_frame_body));
}

}  // namespace troupe::detail
