#pragma once
// The owner_rref actor: one per OwnerRRef (Note [RRef protocol] in rref/context.hpp).
//
// Note [owner_rref actor]
//
// Holds the value as the live object (rpc::held_value). That is what the user function or
// make_rref gave, or a method's new object. It is encoded only when a fetch from another worker
// is answered. The actor also holds the forks it knows and its local references: owner-local
// handles and the pending children of those handles. It holds the local fetches / method calls
// parked until the value exists. The user function runs on the executor, never here.
//
//   spawned lazily (CAF lazy_init: no scheduler wake-up until its first message), either
//   READY by make_rref (one local reference) or by the thread that ran a remote_call's function
//   (the creator fork, the value) when nothing needed the actor before; or PENDING by the first
//   message that needs it earlier (fork_request, user_delete, child_ack, a bind on the owner,
//   a lease or owner-local fetch: no order is assumed between them and the remote_call)
//
// Where a pending OwnerRRef's state lives: from the remote_call until its function returns, if
// nothing else names the id, there is no actor. The router's entry holds all there is. It holds
// started and RUNNING (the dedupe; deletion refused) and the fetches parked from other workers.
// Then it holds the snapshot and the withheld accept (Note [withheld accept] in serve.cpp). The
// creator fork is implied by the running call and handed to the actor with the value.
// Every OwnerRRef whose value exists has an actor, which holds the value, the forks and the
// lifecycle. Some messages need the actor's state earlier: fork_request, user_delete,
// child_ack, a bind on the owner, a lease or an owner-local fetch. Each spawns it PENDING, and
// it then gets the value as value_set. Why lazy: an actor spawned PENDING must be sent the
// value. That first message schedules it, a CAF scheduler wake-up on the owner inside every
// round trip (figures in docs/rref.md).
//
//   PENDING --value_set(creator fork, value | error)--> READY: answers the parked local fetches
//   PENDING --local_fetch / lease_request--> PENDING (parked until READY)
//   READY --lease_request--> LEASED --lease_return--> READY (one method at a time; a method works
//                            on a copy of the object and hands back the new one: published)
//
// The actor owns the value's lifecycle (forks, deletion). The router's entry of the id
// (owner_entry, context_impl.hpp) holds a read-through snapshot: a shared_ptr to an immutable
// published_value. It also holds the fetches from other workers parked before the value exists:
//
//   fetch (executor thread) --lock--> snapshot? answer it on this thread (no actor hop)
//                                     none: park the reply in the entry
//   remote_call's thread, function done --lock--> install snapshot, take the parked fetches
//                        --unlocked--> answer them on this thread (the fetch reply leaves first)
//                        --lock--> value_set to the actor (or spawn it READY); entry not RUNNING
//   lease_return (actor) --> new snapshot        deletion (actor) --lock--> entry erased:
//                                                snapshot revoked, parked fetches failed
//
// Answering encodes the value on the answering thread under that fetch's served-call scopes
// (Note [deferred reply]), so distributed autograd records the send there. A fetch never sees a
// deleted value: the snapshot is read and installed under the router's mutex, and deletion
// erases it under the same mutex. While the function runs (the entry is RUNNING), the router
// refuses the actor's deletion (owner_gone). So a PENDING actor spawned meanwhile waits for its
// value_set, as it waits for a local reference on its way. A closed context fails parked
// fetches with invalid_state; an owner process that dies fails them at the callers (peer_lost).
//
//   PENDING|READY --no known fork, no local ref, no pending child, no lease, and READY or the
//                   creator fork deleted--> DELETED: tells the router (tombstone; refused while
//                   RUNNING or a local ref is on its way), fails parked requests with
//                   invalid_state, quits once its own control messages are done
//
// Guarantees: the function runs once per id (the router starts it once, Note [RRef protocol]).
// A fork deleted once is never re-added by a late fork_request or value_set. This layer never
// changes the held object in place; methods replace it. So a fetch encodes a consistent object
// while a method runs. Tensors inside it share storage with the method's copy. So a method that
// changes tensor data in place may race with a concurrent fetch's encode.
// Answers a fork_request (delegated by the node's service, Note [rref service] in service.cpp)
// with the owner accept itself. Sends (retried, Note [RRef protocol]): fork_probe for children
// whose carrier was lost.

#include <optional>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "protocol.hpp"

namespace troupe::rref_detail {

class context_impl;

/// The owner_rref interface.
using owner_rref_actor = caf::typed_actor<
    caf::reacts_to<rref_msg::value_set>,
    caf::replies_to<rref_msg::fork_request>::with<rref_msg::answer>,
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

/// How an owner actor starts: PENDING (the default), or READY with its value. A READY actor has
/// either one local reference (make_rref) or the creator fork (a remote_call whose function
/// finished first).
struct owner_start {
  bool ready = false;
  std::int32_t code = 0;
  std::string message;
  rref_msg::held_ptr value;
  int local = 0;
  std::optional<fork_id> fork;
};

/// Spawns the owner of `id` on the router's actor system, lazily (its behaviour starts with its
/// first message, so spawning wakes no scheduler thread). Never blocks.
owner_rref_actor spawn_owner_rref(context_impl& r, const rref_id& id, owner_start start);

}  // namespace troupe::rref_detail
