#pragma once
// The user_rref actor: one per UserRRef fork held by this node (Note [RRef protocol] in
// rref/context.hpp).
//
// Note [user_rref actor]
//
// The fork context. It holds the holds on the fork: live handles of this node, plus children it
// passed on whose child_ack is missing (G2). It holds the parents it must ack once the owner
// confirmed it. It holds the retry state of its control messages (fork_request, child_ack,
// user_delete, fork_probe).
//
//   remote() (creator fork) --> UNCONFIRMED --remote_done ok--> CONFIRMED
//                                           --remote_done lost--> fork_request (retried)
//   bound from a wire --> UNCONFIRMED --fork_request (retried)--> accept --> CONFIRMED
//                                                               refused / owner lost --> FAILED
//   CONFIRMED|FAILED: child_ack to every parent (retried)
//   CONFIRMED, holds == 0 --> DELETING: tells the router (tombstone), hands user_delete to the
//                             courier (batched per owner and retried there; G1: Note [release
//                             batching] in courier.cpp)
//   FAILED, holds == 0 --> DELETING without a delete
//   DELETING and no control message pending --> quits
//
// The creator fork is spawned lazily: its first message is remote_done or a release. Its
// remote_done comes when the handle is passed on, asked whether confirmed, or released
// (handle::watch). After a plain remote + to_here + release, one remote_done carries the
// release, so the actor is scheduled once for both. A handle's release reaches its fork
// through the courier when the release window ends (Note [release batching]).
//
// A duplicate carrier (the same fork arriving twice) adds a hold and one more parent to ack. In
// DELETING it is refused, and the router then hands out a failed handle. to_here does not involve
// this actor (its fetch is a call to the owner).

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "protocol.hpp"

namespace troupe::rref_detail {

class context_impl;

/// The user_rref interface. carrier / child_hold / status answer hold_answer (code 0, or the
/// fork's failure: owner_lost, invalid_state).
using user_rref_actor = caf::typed_actor<
    caf::reacts_to<rref_msg::remote_done>,
    caf::replies_to<rref_msg::carrier>::with<rref_msg::hold_answer>,
    caf::replies_to<rref_msg::child_hold>::with<rref_msg::hold_answer>,
    caf::reacts_to<rref_msg::release_atom>,
    caf::reacts_to<rref_msg::child_ack>,
    caf::reacts_to<rref_msg::probe_start>,
    caf::reacts_to<rref_msg::probe_due_atom, std::uint64_t>,
    caf::replies_to<rref_msg::status_atom>::with<rref_msg::hold_answer>,
    caf::reacts_to<rref_msg::control_done>,
    caf::reacts_to<rref_msg::retry_atom, std::uint64_t>,
    caf::replies_to<rref_msg::summary_atom>::with<std::string>,
    caf::reacts_to<rref_msg::done_atom>>;

/// How a fork came to this node.
struct user_origin {
  std::string owner;
  bool creator = false;  ///< made by remote(): confirmed by remote_done, no parent
  std::string parent;    ///< else: the parent to ack, its fork and hold token
  fork_id parent_fork;
  std::uint64_t token = 0;
};

/// Spawns the fork context of (id, fork) with one hold (the handle being created).
user_rref_actor spawn_user_rref(context_impl& r, const rref_id& id, const fork_id& fork, user_origin origin);

}  // namespace troupe::rref_detail
