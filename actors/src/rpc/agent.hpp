#pragma once
// The node agent actor, one per node.
//
// Note [node agent]
// The agent admits peers and watches them; it carries no calls (every call takes the direct
// channel, Note [direct channel]).
// - hello: a peer presents the job token and its identity (Note [worker identity]). The answer
//   carries the store, this node's direct port with a one-use secret for that peer, and the
//   shared-memory probe (Note [shm reachability]).
// - watch: the agent monitors each peer's agent once. A peer may lose its CAF connection, stop
//   its middleman heartbeat (a frozen process), or be declared lost by the silence watch
//   (Note [silent peers]). It is then reported once through on_peer_down. The node then fails
//   that peer's calls on the direct channel and notifies peer-loss watchers.
//
//   peer --hello{token, info}==CAF==> agent --issue_ticket--> direct channel
//   peer <==hello_ack{store, direct port, secret, shm probe}== agent

#include <functional>
#include <memory>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/allowed_unsafe_message_type.hpp>

#include "auth_set.hpp"
#include "rpc/bulk.hpp"
#include "troupe/actors/worker_info.hpp"

namespace troupe::detail {

/// Everything an agent needs; shared with the node.
struct agent_config {
  worker_info me;
  std::string token;
  std::shared_ptr<auth_set> auth;
  std::shared_ptr<bulk_names> bulk;  ///< Note [tensor over shared memory]
  caf::actor store;  ///< rank 0 only
  /// Called on the agent's thread when a peer agent goes down (must not block).
  std::function<void(const std::string& peer, const std::string& reason)> on_peer_down;
  /// The direct rpc port and a one-use secret for a peer that presented the token (Note [rpc
  /// direct channel]).
  std::function<std::pair<std::uint16_t, std::string>(const std::string& peer, const caf::node_id& node)> issue_ticket;
  /// Called on the agent's thread with a peer that said hello and its agent (must not block).
  std::function<void(const std::string& peer, const caf::actor& agent)> on_greeted;
};

/// Asks the agent to monitor a peer agent (local only).
struct watch_peer_msg {
  caf::actor peer;
  std::string name;
};

/// Tells the agent that a peer has been silent past the peer timeout (Note [silent peers]).
/// The peer is lost as if its heartbeat had stopped (local only).
struct peer_silent_msg {
  std::string name;
  std::string reason;
};

/// Spawns the agent (Note [node agent]).
caf::actor spawn_agent(caf::actor_system& sys, agent_config cfg);

}  // namespace troupe::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::watch_peer_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::peer_silent_msg)
