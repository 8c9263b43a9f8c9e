#pragma once
// The owner_rref actor: one per OwnerRRef (Note [RRef protocol] in rref/context.hpp).
//
// Note [owner_rref actor]
// Holds the value as the live object (rpc::held_value: what the user function or make_rref gave,
// or a method's new object; encoded only when a fetch from another worker is answered), or the
// pending result of the user function (which runs on the executor, never here), the forks it
// knows, its local references (owner-local handles and the pending children of those handles)
// and the fetches/method calls parked until the value exists.
//
//   spawned by the router for the first message naming the id (remote_call, fork_request,
//   fetch, user_delete may come in any order) or by make_rref (READY at once)
//
//   PENDING --remote_started--> RUNNING --value_set--> READY(value | error): publishes it,
//                                                      answers the parked fetches
//   PENDING --remote_fetch / local_fetch / lease_request--> PENDING (parked until READY)
//   READY --lease_request--> LEASED --lease_return--> READY (one method at a time; a method works
//                            on a copy of the object and hands back the new one: published)
//
// The actor owns the value and its lifecycle. What the router's entry of the id holds
// (owner_entry, context_impl.hpp) is only a read-through snapshot (shared_ptr to an immutable
// published_value) that this actor installs when the value exists or changes and that deletion
// revokes (make_rref's value is installed with the entry, as the actor is spawned READY). A
// fetch from another worker that finds the snapshot is answered on its own executor thread
// without entering the actor; one that finds none (the value does not exist yet: the usual case
// for the creator, whose fetch races its remote_call) is sent here as remote_fetch, parked, and
// answered when value_set arrives. Answering encodes the value on the answering thread under
// that fetch's served-call scopes (Note [deferred reply]), so distributed autograd records the
// send here. Deletion fails parked fetches with invalid_state; a closed context drops them (the
// reply answers invalid_state); an owner process that dies fails them at the callers (peer_lost).
//
//   PENDING|READY --no known fork, no local ref, no pending child, no lease, and READY or the
//                   creator fork deleted--> DELETED: tells the router (tombstone), fails parked
//                   requests with invalid_state, quits once its own control messages are done
//
// Guarantees: the function runs once per id (the router starts it once, Note [RRef protocol]);
// a fork deleted once is never re-added by a late fork_request or remote_call copy. The held
// object is never changed in place by this layer (methods replace it), so a fetch encodes a
// consistent object while a method runs; tensors inside it share storage with the method's copy,
// so a method that changes tensor data in place may race with a concurrent fetch's encode.
// Sends (retried, Note [RRef protocol]): fork_probe for children whose carrier was lost.

#include <optional>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "protocol.hpp"

namespace troupe::rref_detail {

class context_impl;

/// The owner_rref interface.
using owner_rref_actor = caf::typed_actor<
    caf::reacts_to<rref_msg::remote_started>,
    caf::reacts_to<rref_msg::value_set>,
    caf::reacts_to<rref_msg::remote_fetch>,
    caf::reacts_to<rref_msg::fork_request_reply>,
    caf::reacts_to<rref_msg::user_delete>,
    caf::reacts_to<rref_msg::child_ack>,
    caf::replies_to<rref_msg::local_fetch>::with<rref_msg::held_answer>,
    caf::replies_to<rref_msg::lease_request>::with<rref_msg::held_answer>,
    caf::reacts_to<rref_msg::lease_return>,
    caf::reacts_to<rref_msg::child_hold>,
    caf::reacts_to<rref_msg::probe_start>,
    caf::reacts_to<rref_msg::probe_due_atom, std::uint64_t>,
    caf::reacts_to<rref_msg::local_ref_atom, std::int32_t>,
    caf::reacts_to<rref_msg::control_done>,
    caf::reacts_to<rref_msg::retry_atom, std::uint64_t>,
    caf::replies_to<rref_msg::summary_atom>::with<std::string>,
    caf::reacts_to<rref_msg::done_atom>>;

/// Spawns the owner of `id` on the router's actor system. `value`: make_rref's value (READY
/// with one local reference) or null (PENDING).
owner_rref_actor spawn_owner_rref(context_impl& r, const rref_id& id, rref_msg::held_ptr value);

}  // namespace troupe::rref_detail
