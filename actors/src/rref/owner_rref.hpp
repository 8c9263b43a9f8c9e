#pragma once
// The owner_rref actor: one per OwnerRRef (Note [RRef protocol] in rref/context.hpp).
//
// Note [owner_rref actor]
// Holds the value (or the pending result of the user function, which runs on the executor,
// never here), the forks it knows, its local references (owner-local handles and the pending
// children of those handles) and the fetches/method calls parked until the value exists.
//
//   spawned by the router for the first message naming the id (remote_call, fork_request,
//   fetch, user_delete may come in any order) or by make_rref (READY at once)
//
//   PENDING --remote_call--> RUNNING --value_set--> READY(value | error)
//   PENDING --fetch--> PENDING (parked: value_ready to the requester once READY)
//   PENDING --local_fetch / lease_request--> PENDING (response promise kept)
//   READY --lease_request--> LEASED --lease_return--> READY (one method at a time)
//   PENDING|READY --no known fork, no local ref, no pending child, no lease, and READY or the
//                   creator fork deleted--> DELETED: tells the router (tombstone), fails parked
//                   promises with invalid_state, quits once its own control messages are done
//
// Guarantees: the function runs once per id (a duplicated remote_call answers "duplicate");
// a fork deleted once is never re-added by a late fork_request or remote_call copy.
// Sends (retried, Note [RRef protocol]): value_ready to parked fetchers, fork_probe for
// children whose carrier was lost.

#include <optional>

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "protocol.hpp"

namespace troupe::rref_detail {

class context_impl;

/// The owner_rref interface. remote_call answers 0 (run the function now) or 1 (duplicate).
using owner_rref_actor = caf::typed_actor<
    caf::replies_to<rref_msg::remote_call>::with<std::int32_t>,
    caf::reacts_to<rref_msg::value_set>,
    caf::replies_to<rref_msg::fork_request>::with<std::int32_t>,
    caf::replies_to<rref_msg::user_delete>::with<std::int32_t>,
    caf::reacts_to<rref_msg::child_ack>,
    caf::replies_to<rref_msg::fetch>::with<rref_msg::fetch_answer>,
    caf::replies_to<rref_msg::local_fetch>::with<rref_msg::fetch_answer>,
    caf::replies_to<rref_msg::lease_request>::with<rref_msg::fetch_answer>,
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
/// with one local reference) or nullopt (PENDING).
owner_rref_actor spawn_owner_rref(context_impl& r, const rref_id& id, std::optional<std::vector<char>> value);

}  // namespace troupe::rref_detail
