#pragma once
// The typed messages of the RRef protocol (Note [RRef protocol] in rref/context.hpp) and the
// retry state both actors use for their idempotent control messages.
//
// Cross-process messages (announced in actors/src/messages.cpp). The control messages
// (fork_request, child_ack, user_delete_batch, fork_probe) are remote actor messages. They are
// requests to the peer node's RRef service actor (Note [rref service] in service.cpp), answered
// with an `answer`. The fault plan sees each as "actor:troupe.rref.<name>" and each answer as
// "actor:troupe.rref.answer". The data messages (remote_call, fetch) are written with CAF's
// binary serializer. They go into the byte-vector argument of the reserved RPC functions
// "troupe.rref.<name>" (Note [rref data path] in serve.cpp). Ids and strings only; values never
// travel in them (a fetch's answer is the deferred reply of its RPC, the encoded value itself).
// The other messages here never leave the process: an actor and its router or handles. Those
// that carry live values or reply handles are never serialized.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/atom.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/message.hpp>
#include <caf/meta/type_name.hpp>

#include <caf/allowed_unsafe_message_type.hpp>

#include "bounded_deserializer.hpp"
#include "troupe/actors/rpc/registry.hpp"
#include "troupe/actors/rref/ids.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::rref_msg {

// ---- cross-process ----

/// caller -> owner (RPC): run `function(args)` as the value of `id`, known to the creator fork `fork`.
/// A user call: never retried; deduplicated by id on the owner. Reply: accepted (bool).
struct remote_call {
  rref_id id;
  fork_id fork;
  std::string function;
  std::vector<char> args;
};
template <class I> typename I::result_type inspect(I& f, remote_call& x) {
  return f(caf::meta::type_name("troupe.rref.remote_call"), x.id, x.fork, x.function, x.args);
}

/// child -> owner: record `fork` as a known fork of `id`. Retried; the answer is the owner accept
/// (0 accepted, 1 refused: the RRef is gone).
struct fork_request {
  rref_id id;
  fork_id fork;
};
template <class I> typename I::result_type inspect(I& f, fork_request& x) {
  return f(caf::meta::type_name("troupe.rref.fork_request"), x.id, x.fork);
}

/// child -> parent: the owner accepted the child; the parent (its fork `parent_fork`, empty on
/// the owner) drops the hold `token`. Retried; idempotent.
struct child_ack {
  rref_id id;
  fork_id parent_fork;
  std::uint64_t token = 0;
};
template <class I> typename I::result_type inspect(I& f, child_ack& x) {
  return f(caf::meta::type_name("troupe.rref.child_ack"), x.id, x.parent_fork, x.token);
}

/// user -> owner: the UserRRef `fork` of `id` is gone. Retried; idempotent.
struct user_delete {
  rref_id id;
  fork_id fork;
};
template <class I> typename I::result_type inspect(I& f, user_delete& x) {
  return f(caf::meta::type_name("troupe.rref.user_delete"), x.id, x.fork);
}

/// user node -> owner: the user_deletes of forks released on one node within
/// rref_options::release_window, in one message. Retried; idempotent (each delete is).
struct user_delete_batch {
  std::vector<user_delete> deletes;
};
template <class I> typename I::result_type inspect(I& f, user_delete_batch& x) {
  return f(caf::meta::type_name("troupe.rref.user_delete_batch"), x.deletes);
}

/// parent -> child node after a call that carried `fork` failed. It asks: "did you receive it?"
/// Answer 1 (yes: its child_ack will come) or 0 (no; a late arrival is now refused). Retried.
struct fork_probe {
  rref_id id;
  fork_id fork;
};
template <class I> typename I::result_type inspect(I& f, fork_probe& x) {
  return f(caf::meta::type_name("troupe.rref.fork_probe"), x.id, x.fork);
}

/// The answer of the peer's service to a control message: fork_request's accept, fork_probe's
/// received flag, 0 for child_ack and user_delete_batch.
struct answer {
  std::int32_t value = 0;
};
template <class I> typename I::result_type inspect(I& f, answer& x) {
  return f(caf::meta::type_name("troupe.rref.answer"), x.value);
}

/// user -> owner (to_here, RPC): the value of `id`. A deferred reply (Note [deferred reply]),
/// answered when the value exists. The answer is encode_result<T> of the live value, encoded
/// under the fetch's served-call scope. Or it fails with the stored error.
struct fetch {
  rref_id id;
  fork_id fork;
  std::string requester;
};
template <class I> typename I::result_type inspect(I& f, fetch& x) {
  return f(caf::meta::type_name("troupe.rref.fetch"), x.id, x.fork, x.requester);
}

/// Unused since the fetch is a deferred reply (kept: its type is announced in messages.cpp).
struct value_ready {
  rref_id id;
  fork_id fork;
};
template <class I> typename I::result_type inspect(I& f, value_ready& x) {
  return f(caf::meta::type_name("troupe.rref.value_ready"), x.id, x.fork);
}

/// Unused since the values are held as live objects (kept: its type is announced in
/// messages.cpp).
struct fetch_answer {
  std::int32_t code = 0;
  std::string message;
  std::vector<char> value;
};
template <class I> typename I::result_type inspect(I& f, fetch_answer& x) {
  return f(caf::meta::type_name("troupe.rref.fetch_answer"), x.code, x.message, x.value);
}

// ---- in-process (router, handles, executor -> actor) ----

// These carry live values (rpc::held_value) or reply handles: never serialized
// (CAF_ALLOW_UNSAFE_MESSAGE_TYPE below).

/// A live value (the object a function returned, make_rref's value, a method's new object).
using held_ptr = std::shared_ptr<const rpc::held_value>;

/// The user function of a remote_call for the creator fork `fork` returned (code 0 and the live
/// value) or threw. Sent by the thread that ran it, after it published the value and answered
/// the fetches parked in the router (Note [owner_rref actor]).
struct value_set {
  std::int32_t code = 0;
  std::string message;
  held_ptr value;
  fork_id fork;
};

/// The owner's answer to a local_fetch or lease_request: code 0 and the value, or an errc and
/// its message.
struct held_answer {
  std::int32_t code = 0;
  std::string message;
  held_ptr value;
};

/// A local fetch on the owner (owner-local to_here): parked in the actor until the value exists.
struct local_fetch {
  std::int64_t deadline_ms = 0;  ///< steady-clock ms; a later answer is not waited for
};
template <class I> typename I::result_type inspect(I& f, local_fetch& x) {
  return f(caf::meta::type_name("troupe.rref.local_fetch"), x.deadline_ms);
}

/// A method call takes the value (exclusively) until lease_return; parked while the value does
/// not exist or another method holds it.
struct lease_request {
  std::uint64_t lease = 0;
};
template <class I> typename I::result_type inspect(I& f, lease_request& x) {
  return f(caf::meta::type_name("troupe.rref.lease_request"), x.lease);
}
/// Ends a lease: `changed` replaces the value with `value`.
struct lease_return {
  std::uint64_t lease = 0;
  bool changed = false;
  held_ptr value;
};

/// An rref handle of this node gives this fork (or owner) one more child: the hold `token`
/// stays until the child's child_ack. `caller` (a result's destination) gets a fork_probe if no
/// ack came after `probe_after_ms`; empty: an argument, probed by its sender on failure.
struct child_hold {
  std::uint64_t token = 0;
  fork_id child;
  std::string caller;
  std::int64_t probe_after_ms = 0;
};
template <class I> typename I::result_type inspect(I& f, child_hold& x) {
  return f(caf::meta::type_name("troupe.rref.child_hold"), x.token, x.child, x.caller, x.probe_after_ms);
}

/// The answer to child_hold / carrier / status: code 0, or the fork's failure.
struct hold_answer {
  std::int32_t code = 0;
  std::string message;
  bool confirmed = false;
};
template <class I> typename I::result_type inspect(I& f, hold_answer& x) {
  return f(caf::meta::type_name("troupe.rref.hold_answer"), x.code, x.message, x.confirmed);
}

/// The call that carried the child of `token` failed: ask `to` (fork_probe) whether it has it.
struct probe_start {
  std::uint64_t token = 0;
  std::string to;
};
template <class I> typename I::result_type inspect(I& f, probe_start& x) {
  return f(caf::meta::type_name("troupe.rref.probe_start"), x.token, x.to);
}

/// A duplicate carrier of a fork already held here: one more hold, ack `parent` once confirmed.
struct carrier {
  std::string parent;
  fork_id parent_fork;
  std::uint64_t token = 0;
};
template <class I> typename I::result_type inspect(I& f, carrier& x) {
  return f(caf::meta::type_name("troupe.rref.carrier"), x.parent, x.parent_fork, x.token);
}

/// The remote_call that created this (creator) fork completed: errc and the owner's accept.
/// `release`: the handle's release comes with it (handle::watch), as a release_atom would.
struct remote_done {
  std::int32_t code = 0;
  bool accepted = false;
  bool release = false;
};
template <class I> typename I::result_type inspect(I& f, remote_done& x) {
  return f(caf::meta::type_name("troupe.rref.remote_done"), x.code, x.accepted, x.release);
}

/// A control message this actor sent was answered (code 0 and the answer) or failed.
struct control_done {
  std::uint64_t seq = 0;
  std::int32_t code = 0;
  std::int32_t reply = 0;
};
template <class I> typename I::result_type inspect(I& f, control_done& x) {
  return f(caf::meta::type_name("troupe.rref.control_done"), x.seq, x.code, x.reply);
}

/// Actor timers: resend control message `seq`; probe the result child `token`.
using retry_atom = caf::atom_constant<caf::atom("rretry")>;
using probe_due_atom = caf::atom_constant<caf::atom("rprobedue")>;
/// A handle of this node was released (one hold less) / a handle of the owner was bound.
using release_atom = caf::atom_constant<caf::atom("rrelease")>;
using local_ref_atom = caf::atom_constant<caf::atom("rlocalref")>;
/// "What are you?" (the leak report line), "what is your state?" (a fork's failure).
using summary_atom = caf::atom_constant<caf::atom("rsummary")>;
using status_atom = caf::atom_constant<caf::atom("rstatus")>;
/// An actor ends itself with this, after the request it is answering (a handler that quits
/// directly may lose its response).
using done_atom = caf::atom_constant<caf::atom("rdone")>;

/// Writes `m` with CAF's binary serializer (its inspect()).
template <class Msg>
std::vector<char> to_bytes(caf::actor_system& sys, Msg m) {
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  if (auto err = sink(m)) throw error(errc::protocol_violation, "rref: cannot write " + sys.render(err));
  return buf;
}

/// Reads a message written by to_bytes; throws protocol_violation naming `what` (bytes left over
/// included). Lengths are bounded by the bytes (Note [bounded CAF reader]).
template <class Msg>
Msg from_bytes(caf::actor_system& sys, const std::vector<char>& buf, const char* what) {
  Msg m;
  detail::bounded_deserializer source{sys, buf};
  if (auto err = source(m)) throw error(errc::protocol_violation, std::string("rref: cannot read ") + what + ": " + sys.render(err));
  if (source.remaining() != 0)
    throw error(errc::protocol_violation, std::string("rref: cannot read ") + what + ": " + std::to_string(source.remaining()) +
                                              " bytes left over");
  return m;
}

}  // namespace troupe::rref_msg

namespace troupe::rref_detail {

/// The retry state of one actor's control messages (Note [RRef protocol]). They are idempotent
/// and resent with backoff, 5 ms doubling to 200 ms, until answered. A final failure ends them.
struct control_retries {
  struct pending {
    std::string to;
    caf::message msg;  ///< the request to the service of `to`
    std::chrono::milliseconds backoff{5};
    std::function<void(errc, std::int32_t)> done;
  };
  std::uint64_t next = 1;
  std::map<std::uint64_t, pending> sends;
};

/// Answers that end the retries: the peer is gone or refused for good.
inline bool final_failure(errc c) {
  return c == errc::peer_lost || c == errc::invalid_state || c == errc::unauthorized || c == errc::remote_exception ||
         c == errc::bad_argument || c == errc::protocol_violation || c == errc::unknown_function;
}

}  // namespace troupe::rref_detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::rref_msg::value_set)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::rref_msg::held_answer)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::rref_msg::lease_return)
