#pragma once
// The distributed autograd context actor: one per context on each worker that took part.
//
// Note [context actor]
// The actor owns the context's record, context_state. It holds the send and recv functions by
// message id, the gradients accumulated here, the pass in progress, the workers involved and
// those found dead. The actor drives the context's control exchanges with the same context on
// its peers: PropagateGradients (send, retry, await, dedupe the answers) and the release. They
// are typed requests to the peers'
// service actors (Note [dist autograd service]), so the fault plan applies to them as actor
// messages. The engine and user hooks never run inside it (they run on the thread that called
// backward or on the service's thread, for the local part only). The hot path stays off its
// mailbox. Recording (every RPC) writes the record under its mutex. The (message, pass) a
// worker has already started is decided under that mutex too. Everything that sends, waits,
// retries, polls or parks is the actor's (timers, never a sleep). It monitors every peer service
// it sent to: a down_msg fails at once what it waits for from that worker (peer_lost naming it)
// and marks the worker lost. First attempts go from the thread that has the data, as the
// container's companion (Note [direct requests]). The actor is spawned, lazily initialised,
// only when a context has work for it. Such work is a first attempt that did not end done, a
// parked duplicate, or a release to retry. So the common path spawns none.
//
// PropagateGradients, sending worker S, receiving worker R (the one that sent the tensors):
//
//   S root's run (group g): recv_fn: attempt 1 ──propagate_request──> R service (as the companion);
//            the backward's caller reads the replies (bounded by propagate_timeout): all done ──>
//            finished, no actor involved; any other answer or none ──ctx_start{g, p, answer}──>
//            S actor, which goes on from that answer (below), then ctx_await as for a nested run
//   S nested run (on the service's thread, nested_run.hpp): recv_fn: attempt 1 as the companion,
//            with a deadline of propagate_timeout. The thread that gets the run's last reply
//            (or the deadline sweep: no reply) decides: all done ──> answers the incoming
//            propagation itself, no actor involved; any other answer ──ctx_start{g, p, answer}
//            for each such attempt, then ctx_await──> S actor, which goes on from there
//   S actor: an attempt's answer done / failed ──> the propagation ended
//            later attempts: request(R service, propagate_timeout, propagate_request{...})
//            request timeout ──delayed_send(backoff·2^k)──> attempt k+1   (`attempts` in all)
//            reply running ──delayed_send(backoff·2^k)──> poll again    (until backward_timeout)
//            peer_lost (error or down_msg) ──> ended, the worker marked lost (no release goes there)
//   S run's caller ──ctx_await{g, count, local outcome, answer}──> S actor (one message per run)
//   S actor answers the await once the propagations of g ended: the local error, else the first
//            remote one, else done. The root's backward waits for that answer (bounded).
//   R service: (msg, pass) new? ── yes: run the send function's local part on the service's
//            thread as a nested run (above); the promise is delivered when its propagations
//            ended. A run that started nothing answers at once. Either way the outcome stays in
//            the record (the actor hears of it only when a duplicate is parked)
//                                  ── no (retry, duplicate): the outcome from the record if known
//            there; else ctx_duplicate ──> R actor: the outcome if known, else parked: answered
//            with it when it comes, or `running` after propagate_timeout / 2 (S polls again)
//
// Release: ~context drops the context here, then sends attempt 1 to every worker involved but
//   the dead, as the companion, with a deadline of release_timeout, and returns at once. As in
//   PyTorch, the caller does not wait. The ids stay unique, and a released id is remembered,
//   so a late message recreates nothing. An attempt answered, or failed but for a timeout (a
//   lost or refusing peer), ends that worker's release. One that timed out goes to a fresh
//   context actor (ctx_release{..., settled, retry}), which retries it; nothing blocks on it.
//   container::await_releases waits until every such release ended. container::release and a
//   failed backward do the same but wait for the answers (bounded by release_timeout); only
//   the workers whose attempt timed out go to the actor.
//   live ──ctx_release{except, final, peers}──> releasing: request(release_request{id, me})
//   to every worker involved but `except` and the dead, in parallel; an attempt that times out is
//   retried after a backoff timer (ctx_retry_atom, doubled, `attempts` in all); a peer that is
//   gone or refuses is given up. ──every worker answered or given up──> the answer (number
//   released), then quit when `final` (the context ended here), back to live otherwise (a failed
//   backward releases the peers but keeps the local gradients readable until the context ends).
//   A service serving a release answers once its own actor finished forwarding it. The thread
//   that ends a context looks the peers' services up (the actor never blocks on a lookup).
//
//   worker0 ctx actor ──release_request──> worker1 service ──ctx_release{worker0}──> worker1
//          ^  reply (ok | timeout: timer, retry)     (promise)              ctx actor ──release──> worker2
//
// Guarantees:
// - Every waiter gets exactly one answer (answer_once): an answer dropped with a message or
//   with the ending actor answers invalid_state.
// - Every wait is bounded: propagation_bound for a group; attempts × release_timeout + backoffs
//   for a release.
// - A send function runs at most once per (message, pass).
// - No thread waits for another worker inside a propagation's local part. So nested chains
//   A -> B -> C -> A need one service thread.
// - Release is idempotent: an unknown id is answered at once.
// Assumes: the container outlives no node. It exits every context actor and its service, and
// waits for them, before the node goes. Fails: an exit before a release completed drops the
// remaining attempts. Those peers keep the context until their own container goes.

#include <cstdint>
#include <map>
#include <optional>
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

/// Release the context on the workers involved but `except` (`peers`: their service actors,
/// looked up by the sender; a worker without one is given up); `final`: the context ended here.
/// `done` (may be null) gets the number of workers released. Local only.
struct ctx_release {
  std::string except;
  bool final = true;
  answer_ptr<std::int32_t> done;
  std::map<std::string, caf::actor> peers;
  /// Workers whose first attempt the sender made itself (Note [direct requests]). `settled`
  /// answered or gave up; nothing more goes there. `retry` timed out; the actor retries after a
  /// backoff, counting that attempt.
  std::set<std::string> settled;
  std::set<std::string> retry;
};

/// A PropagateGradients an engine run (group `group`) started: the actor sends it to `peer`
/// (the service of `to`), retries and awaits it. Local only.
struct ctx_start {
  std::uint64_t group = 0;
  std::uint64_t seq = 0;  ///< a new id: the propagation's key in the actor
  std::string to;
  caf::actor peer;
  message_id msg = 0;
  std::uint64_t pass = 0;
  bool retain = false;
  tensor_list grads;
  /// Set when the run's thread made attempt 1 itself (Note [direct requests]): its outcome, which
  /// the actor takes as that attempt's answer instead of sending one.
  std::optional<propagate_answer> first;
};

/// Engine run `group` ended after starting `count` propagations (ctx_start, sent before this):
/// `done` gets the local outcome when it failed, else the first failure, else done, once they
/// all ended. `key` (message, pass): the incoming propagation this run served, whose duplicates
/// get the same answer ((0, 0) on the root worker). `done` may be null. Local only.
struct ctx_await {
  std::uint64_t group = 0;
  std::size_t count = 0;
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
    caf::typed_actor<caf::reacts_to<ctx_release>, caf::reacts_to<ctx_retry_atom, std::string>, caf::reacts_to<ctx_start>,
                     caf::reacts_to<ctx_await>, caf::reacts_to<ctx_duplicate>, caf::reacts_to<ctx_pretry_atom, std::uint64_t>,
                     caf::reacts_to<ctx_running_atom, std::uint64_t>>;

/// Spawns the actor owning `record` on `n`'s actor system.
context_handle spawn_context_actor(node& n, const container_options& opts, std::shared_ptr<context_state> record);

/// Sends `r` (its `done` set here) to `a` and waits for the answer, bounded by the release's own
/// bound; never throws (an actor already gone counts as released).
void release_through(const container_options& opts, const context_handle& a, ctx_release r);

/// Exits every actor of `actors` and waits (bounded) until they are gone.
void stop_actors(node& n, const std::vector<caf::actor>& actors);

}  // namespace troupe::dist_autograd

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::dist_autograd::ctx_release)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::dist_autograd::ctx_start)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::dist_autograd::ctx_await)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::dist_autograd::ctx_duplicate)
