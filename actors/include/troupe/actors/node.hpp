#pragma once
/// \file node.hpp
/// A node: one process's actor system, its identity, its RPC agent and its store connection.
///
/// Note [job token]
///
/// A node publishes only its agent. The agent answers nothing but `hello` until the sender's
/// CAF node has presented the job token. A hello with the right token adds the node to the
/// authenticated set, shared by the agent and, on rank 0, the store. It returns the agent and
/// store handles. A wrong or missing token is refused with `unauthorized` and logged on stderr.
/// Every later request from that node is refused too.
/// Before any CAF byte, a connection passes the node's gate with the same token
/// (Note [CAF port gate] in caf_gate.hpp). Anything else is dropped, and the node keeps serving
/// the others. A hello whose identity clashes with a live node's is refused too
/// (Note [worker identity] in rpc/roster.hpp). An empty token is refused off loopback, and on
/// loopback without node_options::allow_empty_token.
///
///   new node --gate hello{token}--> rank 0 --hello{token, info, agent}--> ack{info, agent, store} | refused
///   new node --store_set("troupe/addr/<name>", host:port)--> store
///   new node --store_set("troupe/worker/<rank>", name)--> store   (the worker list, workers.hpp)
///   caller --store_get(addr)--> store; caller --connect + hello--> peer (cached)
///
/// Lifetime: the constructor joins the job (bounded by join_timeout) or throws. shutdown(), or
/// the destructor at once, fails every pending call. It stops the agent, the store and the
/// executor, and destroys the actor system. Afterwards no thread or actor of the node is left.
/// It then writes the recorder's Chrome trace when node_options::trace_dir is set.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "troupe/actors/flight_recorder.hpp"
#include "troupe/actors/node_options.hpp"
#include "troupe/actors/rpc/device_map.hpp"
#include "troupe/actors/peer_events.hpp"
#include "troupe/actors/rpc/future.hpp"
#include "troupe/actors/rpc/interceptor.hpp"
#include "troupe/actors/rpc/registry.hpp"
#include "troupe/actors/shutdown_hook.hpp"
#include "troupe/actors/store.hpp"
#include "troupe/actors/transport.hpp"
#include "troupe/actors/worker_info.hpp"

namespace caf {
class actor_system;
}

namespace troupe::detail {
class remote_actors;
}

namespace troupe {

/// How shutdown() ends the node.
enum class shutdown_mode {
  /// Waits (store barrier) until every rank reached shutdown, so no rank leaves while others
  /// still call it. A timeout is an error naming the missing ranks; it tears down anyway.
  graceful,
  /// Tears down at once; pending calls fail with invalid_state.
  immediate,
};

/// One process's membership in a job. Move-only RAII; not copyable.
class node {
 public:
  /// Starts the actor system, publishes the agent (rank 0 also hosts the store) and joins the
  /// store. Blocks up to opts.join_timeout. Throws troupe::error:
  ///   * unauthorized: a wrong or empty token, a rank or name a live node holds, another world
  ///     size;
  ///   * timeout / peer_lost: rank 0 is unreachable;
  ///   * io_error: it cannot listen.
  /// Without a hook, it loads a plan named by the environment variable TROUPE_FAULTS and logs
  /// it to stderr. A malformed plan is bad_argument naming the file and line; an unreadable one
  /// is io_error.
  explicit node(node_options opts, const rpc::registry& functions = {}, std::shared_ptr<transport_hook> hook = nullptr);
  /// Immediate shutdown if shutdown() was not called. Never throws.
  ~node();
  node(const node&) = delete;
  node& operator=(const node&) = delete;

  /// This node's identity.
  const worker_info& info() const;
  /// The port this node's agent listens on (rank 0: the master port).
  std::uint16_t port() const;
  /// The port of this node's direct RPC channel (Note [direct channel]); 0 when disabled.
  std::uint16_t rpc_port() const;
  /// The node's CAF actor system, for layers that spawn their own actors (RRef actors,
  /// distributed autograd contexts). Valid until shutdown(); such actors must have quit before
  /// it (their owners are destroyed before the node). Throws invalid_state after shutdown.
  caf::actor_system& system();
  /// The node's remote actor layer (Note [remote actors]; troupe/actors/remote_actor.hpp is its
  /// user API). Throws invalid_state after shutdown or when the node has no direct channel.
  detail::remote_actors& remote_actors();
  /// The functions this node serves; add() is thread-safe at any time.
  rpc::registry& functions();
  /// The blocking store client.
  store_client& store();
  /// The node's flight recorder (Note [flight recorder]): RPCs it calls and serves, and what the
  /// layers above record through it (collectives, backward passes). Valid for the node's whole
  /// life, shutdown included; thread-safe. Its trace goes to node_options::trace_dir.
  flight_recorder& recorder();
  /// The same recorder as a shared handle, for objects that may outlive the node.
  std::shared_ptr<flight_recorder> shared_recorder();
  /// The default call deadline (node_options::default_timeout).
  std::chrono::milliseconds default_timeout() const;
  /// The node's peer-loss events (Note [peer loss events]): subscribe to every lost peer, or
  /// wait on store_host_lost(). Shared; outlives the node (no events after shutdown).
  const std::shared_ptr<peer_events>& peer_losses() const;

  /// Sets the device map for calls to `worker` (Note [rpc device map]). A CUDA tensor argument
  /// on local device i arrives on the peer's device map[i]. Replaces an earlier map of that
  /// worker. Blocks reading the worker list (up to `timeout`). Throws bad_argument (a negative
  /// index, two devices mapped to one, a worker not in the job, naming it), timeout.
  void set_device_map(const std::string& worker, const rpc::device_map& map,
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));
  /// How the CUDA arguments of this node's calls went (Note [rpc device map]): by CUDA IPC
  /// handle or staged through host memory. Never blocks.
  rpc::device_transfers device_transfers() const;
  /// Registers `stop`, which shutdown() (or the destructor) runs before the actor system goes
  /// down (Note [shutdown hooks]); for layers whose actors live on system(). The returned handle
  /// unregisters it. Throws invalid_state after shutdown.
  shutdown_hook at_shutdown(std::function<void()> stop);
  /// Reports that this process reached a named fault point at `step` (Note [fault events]).
  /// The node's transport hook applies a kill or pause of its plan. A no-op without a hook. Called
  /// by user code (troupe::fault_point) and by the library's own points.
  void fault_point(const std::string& point, std::int64_t step);
  /// Passes a message this node does not send itself to its transport hook's on_send and
  /// returns the decision. Such a message is a collective payload of one of its process groups
  /// (Note [collective payload faults]). Without a hook: deliver at once. Never blocks;
  /// thread-safe.
  transport_decision payload_fault(envelope& msg);
  /// Whether the node has a transport hook (a fault plan): without one payload_fault always
  /// delivers, and its callers skip it.
  bool has_transport_hook() const noexcept;

  /// Installs the node's call interceptor (Note [call interceptor]); null uninstalls it.
  /// Thread-safe; calls already encoded keep the scopes they began with.
  void set_interceptor(std::shared_ptr<rpc::call_interceptor> interceptor);

  /// Sends a call to worker `to` (by name). `encode(ctx)` produces the payload once the peer is
  /// known, under the call's codec context. So large tensors to a same-host peer go through
  /// shared memory (Note [codec context]). The future completes by `timeout` at the latest.
  /// Blocks only to resolve a peer the first time (store lookup + connect + hello). With an
  /// interceptor, the context holds the call's scope and the scope's meta travels with the
  /// request (Note [call interceptor]). Used by rpc_sync/rpc_async (rpc/api.hpp). Errors arrive
  /// through the state. `blocking`: the caller waits for the result right after (rpc_sync). Large
  /// inline tensor arguments are then written from their own storage, and call() returns once
  /// the request is sent (Note [borrowed tensor bytes]).
  std::shared_ptr<rpc::detail::call_state> call(const std::string& to, const std::string& function,
                                                const std::function<std::vector<char>(const rpc::codec_context&)>& encode,
                                                std::chrono::milliseconds timeout, bool blocking = false);

  /// Ends the node (see shutdown_mode). Blocks up to `timeout` (graceful). Idempotent. Throws
  /// errc::timeout naming the missing ranks when a graceful barrier times out (after tearing
  /// down).
  void shutdown(shutdown_mode mode, std::chrono::milliseconds timeout = std::chrono::milliseconds(10000));

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
