#pragma once
// The store actor (Note [store] in troupe/actors/store.hpp): its typed interface, and the private
// parts of the blocking client (Note [store client]).

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/atom.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "auth_set.hpp"
#include "troupe/actors/peer_events.hpp"
#include "troupe/actors/rpc/codec_context.hpp"
#include "troupe/actors/messages.hpp"
#include "troupe/actors/transport.hpp"

namespace troupe::detail {

/// The store's own timers: a parked get/wait expires; a barrier generation expires.
using store_expire_atom = caf::atom_constant<caf::atom("sexpire")>;
using store_bexpire_atom = caf::atom_constant<caf::atom("sbexpire")>;

/// The store's typed interface (messages in troupe/actors/messages.hpp). Errors travel as
/// troupe-category caf::errors: unauthorized, timeout (naming keys / missing ranks), bad_argument.
using store_handle = caf::typed_actor<caf::replies_to<store_set>::with<void>,
                                      caf::replies_to<store_get>::with<std::string>,
                                      caf::replies_to<store_wait>::with<std::string>,
                                      caf::replies_to<store_add>::with<std::int64_t>,
                                      caf::replies_to<store_cas>::with<std::string>,
                                      caf::replies_to<store_erase>::with<bool>,
                                      caf::replies_to<store_num_keys>::with<std::int64_t>,
                                      caf::replies_to<store_barrier>::with<void>,
                                      caf::reacts_to<store_expire_atom, std::uint64_t>,
                                      caf::reacts_to<store_bexpire_atom, std::string, std::uint64_t>>;

/// Spawns the store; requests from nodes outside `auth` (and not local) are refused. The handle
/// is returned untyped because it travels in hello_ack; clients cast it back to store_handle.
caf::actor spawn_store(caf::actor_system& sys, std::shared_ptr<auth_set> auth);

/// What a node gives its store_client. `host` names the store's host in peer_lost errors.
struct store_client_impl {
  caf::actor_system* sys = nullptr;
  caf::actor store;
  std::string host = "rank 0";
  caf::actor proxy;  ///< Note [store client]; spawned and stopped by store_client
  /// The node's peer-loss events (null without a node).
  std::shared_ptr<peer_events> events;
  /// Note [lost peer re-admission]: a fresh store handle from the store host (one bounded
  /// attempt; throws peer_lost). Unset: a lost store host stays lost.
  std::function<caf::actor()> reconnect;
  /// Guards `store` against a concurrent reconnect.
  std::shared_ptr<std::mutex> mu = std::make_shared<std::mutex>();
  /// Note [store faults]: the node's transport hook (null: none), this node's worker name and
  /// the store host's.
  std::shared_ptr<transport_hook> hook;
  std::string me;
  std::string host_worker;
  /// The node's executor, told before a request blocks (Note [predicted quick]; null: none).
  std::shared_ptr<const rpc::long_work_notice> work;
};

}  // namespace troupe::detail
