#pragma once
// The distributed autograd context actor: one per context on each worker that took part.
//
// Note [context actor]
// The actor owns the context's record (context_state: send and recv functions by message id, the
// gradients accumulated here, the pass in progress, the workers involved and those found dead)
// and runs its release. The engine and user hooks never run inside the actor (they run on the
// thread that called backward or on the executor serving a PropagateGradients), and recording
// happens on the threads that encode and decode RPCs: they use the record under its mutex, so the
// hot path (every RPC) sends the actor nothing. Cross-process, the control messages travel as
// reserved RPC functions (so the fault plan and peer supervision apply).
//
//   live ──ctx_release{except, final}──> releasing: __troupe_dist_autograd_release(id, me) to every
//        worker involved but `except` and the dead, in parallel; an attempt that times out is
//        retried after a backoff timer (ctx_retry_atom, doubled each time, `attempts` in all); a
//        peer that is gone or refuses is given up (nothing is left to release there)
//   releasing ──every worker answered or given up──> the response (number released), then quit
//        when `final` (the context ended here), back to live otherwise (a failed backward
//        releases the peers but keeps the local gradients readable until the context ends)
//
//   worker0 ctx actor ──release(id, worker0)──> worker1 handler ──ctx_release{worker0}──> worker1
//          ^  ack (ok | timeout: timer, retry)                          ctx actor ──release──> worker2
//
// Guarantees: release is idempotent (a worker that does not know the id answers at once), every
// wait is bounded (attempts × release_timeout + backoffs), each request is answered exactly once.
// Assumes: the container outlives no node (it exits every context actor, and waits for them,
// before the node goes; node::system()'s rule). Fails: an exit before the release completed
// drops the remaining attempts (those peers keep the context until their own container goes).

#include <cstdint>
#include <memory>
#include <string>

#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "container_impl.hpp"

namespace troupe::dist_autograd {

/// Release the context on the workers involved but `except`; `final`: the context ended here.
struct ctx_release {
  std::string except;
  bool final = true;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ctx_release& x) {
  return f(caf::meta::type_name("troupe.dist.ctx_release"), x.except, x.final);
}

/// One release attempt to `worker` ended with `code` (errc: ok, timeout, peer_lost, ...).
struct ctx_release_ack {
  std::string worker;
  std::int32_t code = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ctx_release_ack& x) {
  return f(caf::meta::type_name("troupe.dist.ctx_release_ack"), x.worker, x.code);
}

/// A backoff timer ran out: try the release to the worker again.
using ctx_retry_atom = caf::atom_constant<caf::atom("dctxretry")>;

/// The context actor's typed interface (Note [context actor]).
using context_handle = caf::typed_actor<caf::replies_to<ctx_release>::with<std::int32_t>,
                                        caf::reacts_to<ctx_release_ack>, caf::reacts_to<ctx_retry_atom, std::string>>;

/// Spawns the actor owning `record` on `n`'s actor system.
context_handle spawn_context_actor(node& n, const container_options& opts, std::shared_ptr<context_state> record);

/// Sends `ctx_release{except, final}` to `a` and waits for the answer, bounded by the release's
/// own bound; never throws (an actor already gone counts as released).
void release_through(node& n, const container_options& opts, const context_handle& a, const std::string& except,
                     bool final);

/// Exits every actor of `actors` and waits (bounded) until they are gone.
void stop_context_actors(node& n, const std::vector<context_handle>& actors);

}  // namespace troupe::dist_autograd
