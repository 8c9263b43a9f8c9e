#pragma once
// The distributed autograd context actor: one per context on each worker that took part.
//
// Note [context actor]
// The actor owns the context's record (context_state: send and recv functions by message id, the
// gradients accumulated here, the pass in progress, the workers involved and those found dead) and
// drives the context's control exchanges: PropagateGradients (send, retry, await, dedupe the
// answers) and the release. The engine and user hooks never run inside it (they run on the
// thread that called backward or on the executor serving a PropagateGradients, for the local part
// only). The hot path stays off its mailbox: recording (every RPC) writes the record under its
// mutex, and the (message, pass) a worker has already started is decided under that mutex too.
// First attempts go from the thread that has the data (the engine thread for a propagation, the
// thread that ended the context for a release), and a run that started nothing answers from its
// executor thread: the common path costs no actor hop before a send. Everything that waits,
// retries, polls or parks is the actor's (timers, never a sleep). Cross-process, PropagateGradients
// and the release travel as reserved RPC functions, so the fault plan and peer supervision apply.
// The actor is spawned lazily initialised (no scheduler wake-up per context).
//
// PropagateGradients, sending worker S, receiving worker R (the one that sent the tensors):
//
//   S engine run (group g): recv_fn: attempt 1 from the engine thread (no actor hop before it)
//            ──__troupe_dist_autograd_propagate(ctx, msg, pass, grads)──> R
//   S run's caller ──ctx_await{g, started propagations, local outcome, answer}──> S actor (one
//            message per run); an ack that came first is kept until its propagation is known
//   S actor: ack done / failed ──> the propagation ended   (ctx_propagate_ack, sent by
//            future.then_inline on the thread that completed the call: no executor hop)
//            ack timeout ──delayed_send(backoff·2^k)──> attempt k+1   (`attempts` in all)
//            ack running ──delayed_send(backoff·2^k)──> poll again    (until backward_timeout)
//            peer_lost ──> ended, the worker marked lost (no release goes there)
//   S actor answers the await once the propagations of g ended: the local error, else the first
//            remote one, else done. The root's backward first reads its first attempts' answers
//            itself (bounded by their deadlines: the rpc layer lets a waiting caller read its own
//            response); when every one is `done` it hands the run over without waiting for the
//            actor, at the first other outcome it waits for the actor's answer (bounded)
//   R handler (executor): (msg, pass) new? ── yes: rpc::defer(), run the send function's local
//            part here (group g'), ctx_await{g', key (msg, pass), deferred reply} ──> R actor;
//            the executor thread is free again; the reply goes when g' ended. A run that started
//            nothing answers at once from the executor and keeps the outcome in the record (the
//            actor hears of it only when a duplicate is parked there)
//                                           ── no (retry, duplicate): the outcome from the record
//            if known there; else ctx_duplicate ──> R actor: the outcome if known, else parked:
//            answered with it when it comes, or `running` after propagate_timeout / 2 (the
//            sender polls again)
//
// Release: live ──ctx_release{except, final}──> releasing: __troupe_dist_autograd_release(id, me)
//   to every worker involved but `except` and the dead, in parallel; an attempt that times out is
//   retried after a backoff timer (ctx_retry_atom, doubled, `attempts` in all); a peer that is
//   gone or refuses is given up. ──every worker answered or given up──> the answer (number
//   released), then quit when `final` (the context ended here), back to live otherwise (a failed
//   backward releases the peers but keeps the local gradients readable until the context ends).
//   A worker serving a release defers its reply until its own actor finished forwarding it. On
//   the worker where the context ended, the first attempt to each worker goes from the thread
//   that ended it (no actor hop on the common path); only what timed out is left to the actor.
//
//   worker0 ctx actor ──release(id, worker0)──> worker1 handler ──ctx_release{worker0}──> worker1
//          ^  ack (ok | timeout: timer, retry)      (deferred reply)       ctx actor ──release──> worker2
//
// Guarantees: every waiter gets exactly one answer (answer_once: an answer dropped with a message
// or with the ending actor answers invalid_state), every wait is bounded (propagation_bound for a
// group; attempts × release_timeout + backoffs for a release), a send function runs at most once
// per (message, pass), no executor thread waits for another worker (so nested chains
// A -> B -> C -> A cannot exhaust a small executor), release is idempotent (an unknown id is
// answered at once). Assumes: the container outlives no node (it exits every context actor, and
// waits for them, before the node goes). Fails: an exit before a release completed drops the
// remaining attempts (those peers keep the context until their own container goes).

#include <cstdint>
#include <memory>
#include <set>
#include <vector>
#include <string>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "container_impl.hpp"

namespace troupe::dist_autograd {

/// Release the context on the workers involved but `except` and `released` (done by the caller's
/// first attempt); `final`: the context ended here. `done` (may be null) gets the number of workers
/// released by the actor (local only: never crosses a process).
struct ctx_release {
  std::string except;
  bool final = true;
  answer_ptr<std::int32_t> done;
  std::set<std::string> released;
};

/// One release attempt to `worker` ended with `code` (errc: ok, timeout, peer_lost, ...).
struct ctx_release_ack {
  std::string worker;
  std::int32_t code = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ctx_release_ack& x) {
  return f(caf::meta::type_name("troupe.dist.ctx_release_ack"), x.worker, x.code);
}

/// Attempt `attempt` of outgoing propagation `seq` ended: `answer` is the receiver's
/// (done / running / failed), or (propagate_attempt_failed, errc, text) when the call failed.
struct ctx_propagate_ack {
  std::uint64_t seq = 0;
  int attempt = 0;
  propagate_answer answer;
};

/// Engine run `group` ended and hands over the propagations it started (first attempts made):
/// `done` gets the local outcome when it failed, else the first failure, else done, once they all
/// ended. `key` (message, pass): the incoming propagation this run served, whose duplicates get
/// the same answer ((0, 0) on the root worker). `done` may be null (answered already). Local only.
struct ctx_await {
  std::uint64_t group = 0;
  std::vector<propagation_start> started;
  propagate_answer local;
  std::pair<message_id, std::uint64_t> key;
  answer_ptr<propagate_answer> done;
};

/// A retry or duplicate of the incoming propagation `key`: answer it like the first one.
struct ctx_duplicate {
  std::pair<message_id, std::uint64_t> key;
  answer_ptr<propagate_answer> done;
};

/// A backoff timer ran out: try the release to the worker again.
using ctx_retry_atom = caf::atom_constant<caf::atom("dctxretry")>;
/// A backoff timer ran out: make the next attempt of outgoing propagation `seq`.
using ctx_pretry_atom = caf::atom_constant<caf::atom("dctxpretry")>;
/// A parked duplicate `id` waited propagate_timeout / 2: answer it `running`.
using ctx_running_atom = caf::atom_constant<caf::atom("dctxrun")>;

/// The context actor's typed interface (Note [context actor]).
using context_handle =
    caf::typed_actor<caf::reacts_to<ctx_release>, caf::reacts_to<ctx_release_ack>, caf::reacts_to<ctx_retry_atom, std::string>,
                     caf::reacts_to<ctx_propagate_ack>, caf::reacts_to<ctx_await>,
                     caf::reacts_to<ctx_duplicate>, caf::reacts_to<ctx_pretry_atom, std::uint64_t>,
                     caf::reacts_to<ctx_running_atom, std::uint64_t>>;

/// Makes attempt `attempt` of outgoing propagation `seq` of context `ctx`; its outcome goes to
/// `me` as a ctx_propagate_ack (from the thread that completes the call). Any thread; never
/// throws; returns the attempt's future (empty when the call could not be made).
rpc::future<propagate_answer> send_propagate_attempt(node& n, const container_options& opts, const context_handle& me, context_id ctx,
                            std::uint64_t seq, int attempt, const std::string& to, message_id msg, std::uint64_t pass,
                            const tensor_list& grads, bool retain);

/// Spawns the actor owning `record` on `n`'s actor system.
context_handle spawn_context_actor(node& n, const container_options& opts, std::shared_ptr<context_state> record);

/// Sends `ctx_release{except, final, released}` to `a` and waits for the answer, bounded by the
/// release's own bound; never throws (an actor already gone counts as released).
void release_through(const container_options& opts, const context_handle& a, const std::string& except, bool final,
                     std::set<std::string> released = {});

/// Exits every actor of `actors` and waits (bounded) until they are gone.
void stop_context_actors(node& n, const std::vector<context_handle>& actors);

}  // namespace troupe::dist_autograd

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::dist_autograd::ctx_release)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::dist_autograd::ctx_propagate_ack)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::dist_autograd::ctx_await)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::dist_autograd::ctx_duplicate)
