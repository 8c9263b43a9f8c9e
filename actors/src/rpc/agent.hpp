#pragma once
// The RPC agent actor, one per node.
//
// Note [rpc call]
// (Between nodes, calls normally take the direct channel, Note [rpc fast path]; this agent path
// serves calls to the node itself, nodes with rpc_fast_path = false, and a peer whose direct
// connection could not be opened. Both paths keep the guarantees below.)
// A user thread encodes the arguments, resolves the peer's agent (store lookup, connect, hello;
// cached) and hands a `local_call` to its own agent. The agent gives it an id, records it in the
// pending table with its deadline, monitors the peer agent (once per peer), passes the request
// through the transport hook and sends it. The peer's agent checks that the sender's node
// presented the job token, looks the function up (unknown_function is answered at once) and runs
// it on the executor; the executor hands the response back to its agent, which sends it (hook
// again). The caller's agent completes the call state.
//
//   user --local_call--> agent A ==rpc_request==> agent B --job--> executor B
//   user <--future------ agent A <==rpc_response== agent B <--outgoing_response--'
//
// Failure: every pending call completes exactly once, by its response, by the deadline sweep
// (timeout), by the peer agent's down_msg (peer_lost naming the worker; a SIGKILLed peer is seen
// as a dropped connection in about a millisecond, a frozen one by the middleman heartbeat), or
// by the agent's exit (invalid_state). A user function runs only on the executor, so it may block
// on nested calls (to a third worker or back to the caller) without stalling any agent.

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/allowed_unsafe_message_type.hpp>

#include "auth_set.hpp"
#include "executor.hpp"
#include "rpc/bulk.hpp"
#include "rpc/intercept.hpp"
#include "troupe/actors/rpc/future.hpp"
#include "troupe/actors/rpc/registry.hpp"
#include "troupe/actors/transport.hpp"
#include "troupe/actors/worker_info.hpp"

namespace troupe::detail {

/// A call handed by a user thread to its own agent (local only, never serialized).
struct local_call {
  std::shared_ptr<rpc::detail::call_state> state;
  caf::actor peer;
  std::string peer_name;
  std::string function;
  std::vector<char> payload;
  std::vector<char> meta;  ///< Note [call interceptor]
};

/// Everything an agent needs; shared with the node.
struct agent_config {
  worker_info me;
  std::string token;
  std::shared_ptr<auth_set> auth;
  std::shared_ptr<rpc::registry> functions;
  std::shared_ptr<executor> exec;
  std::shared_ptr<bulk_names> bulk;  ///< Note [tensor over shared memory]
  std::shared_ptr<transport_hook> hook;
  std::shared_ptr<rpc::detail::interceptor_slot> interceptor;  ///< Note [call interceptor]
  caf::actor store;  ///< rank 0 only
  /// Called on the agent's thread when a peer agent goes down (must not block).
  std::function<void(const std::string& peer, const std::string& reason)> on_peer_down;
  /// The direct rpc port and a one-use secret for a peer that presented the token (Note [rpc
  /// fast path]); unset: no fast path.
  std::function<std::pair<std::uint16_t, std::string>(const std::string& peer, const caf::node_id& node)> issue_ticket;
  /// The node's recorder (Note [flight recorder]): served calls are recorded there.
  flight_recorder* recorder = nullptr;
};

/// Asks the agent to monitor a peer agent it has not called through CAF (local only).
struct watch_peer_msg {
  caf::actor peer;
  std::string name;
};

/// Tells the agent that a peer has been silent past the peer timeout (Note [silent peers]): it
/// is lost as if its heartbeat had stopped (local only).
struct peer_silent_msg {
  std::string name;
  std::string reason;
};

/// Spawns the agent (see Note [rpc call]).
caf::actor spawn_agent(caf::actor_system& sys, agent_config cfg);

}  // namespace troupe::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::local_call)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::watch_peer_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::detail::peer_silent_msg)
