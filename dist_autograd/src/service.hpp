#pragma once
// The distributed autograd service actor: one per container, the worker's entry point for its
// peers' context actors.
//
// Note [dist autograd service]
// Each container spawns one service actor on its node's actor system and publishes it under
// "troupe.dist_autograd.service" (troupe/actors/remote_actor.hpp). A peer looks it up once per
// worker and keeps the handle (container::impl::peer). The context actors exchange typed
// messages with it, and so do the first attempts sent by the calling threads (Note [direct
// requests]). No reserved RPC function is involved. So the fault plan sees them as actor
// messages (`actor:troupe.dist_autograd.*`).
//
//   worker S ctx actor ──request(propagate_request{ctx, msg, pass, grads})──> worker R service
//            <──────────────────────── propagate_reply{state, errc, text} ──  (a response promise)
//   worker A ctx actor ──request(release_request{ctx, from})──> worker B service
//            <────────────────────────── release_reply{released} ──  (after B forwarded it)
//   trainer (scoped_actor) ──request(optim_create / optim_step / optim_drop)──> owner service
//            <────────────────────────── optim_reply{value} ──  (Note [distributed optimizer])
//
// The service is a detached actor. It runs the local part of a propagation (the engine, user
// hooks) on its own thread, never on a scheduler thread. It may block on a first lookup of a
// peer. The local part never waits for another worker, so one thread serves every context. Some
// answers are known later: a propagation that started others, a forwarded release. Such an
// answer goes to the requester from the context actor that learnt it, without a hop back
// through the service. It is a delegated reply: the request's sender and id travel with the answer.
// Message types are announced by dist_autograd::add_message_types before the node starts.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include "container_impl.hpp"
#include "troupe/actors/remote_actor.hpp"

namespace troupe::dist_autograd {

/// The name the service is published under, on every worker.
inline constexpr const char* service_name = "troupe.dist_autograd.service";

/// PropagateGradients: run send function `msg` of context `ctx` with `grads` in pass `pass`.
/// Idempotent per (msg, pass): a retry or duplicate gets the first one's outcome.
struct propagate_request {
  context_id ctx = 0;
  message_id msg = 0;
  std::uint64_t pass = 0;
  std::int32_t attempt = 0;
  bool retain = false;
  tensor_list grads;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, propagate_request& x) {
  return f(caf::meta::type_name("troupe.dist_autograd.propagate_request"), x.ctx, x.msg, x.pass, x.attempt, x.retain,
           x.grads);
}

/// The answer of a propagate_request: propagate_done / propagate_running / propagate_failed,
/// with the errc and text of the worker where it failed.
struct propagate_reply {
  std::int32_t state = 0;
  std::int32_t code = 0;
  std::string text;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, propagate_reply& x) {
  return f(caf::meta::type_name("troupe.dist_autograd.propagate_reply"), x.state, x.code, x.text);
}

/// Release context `ctx` on the receiver and on its own peers but `from`. Idempotent.
struct release_request {
  context_id ctx = 0;
  std::string from;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, release_request& x) {
  return f(caf::meta::type_name("troupe.dist_autograd.release_request"), x.ctx, x.from);
}

/// The answer of a release_request once the receiver's part ended.
struct release_reply {
  std::int32_t released = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, release_reply& x) {
  return f(caf::meta::type_name("troupe.dist_autograd.release_reply"), x.released);
}

/// Distributed optimizer (Note [distributed optimizer]): create optimizer `id` of `kind` over the
/// parameters `keys` owned by the receiver. The hyperparameters travel as their IEEE-754 bits
/// (CAF's own double serialization is lossy: CAF-0.17-NOTES pitfall 1).
struct optim_create {
  std::uint64_t id = 0;
  std::int32_t kind = 0;
  std::vector<std::uint64_t> hyper_bits;
  std::vector<std::string> keys;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, optim_create& x) {
  return f(caf::meta::type_name("troupe.dist_autograd.optim_create"), x.id, x.kind, x.hyper_bits, x.keys);
}

/// Apply the gradients context `ctx` accumulated on the receiver with optimizer `id`. Not
/// idempotent: never retried.
struct optim_step {
  std::uint64_t id = 0;
  context_id ctx = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, optim_step& x) {
  return f(caf::meta::type_name("troupe.dist_autograd.optim_step"), x.id, x.ctx);
}

/// Forget optimizer `id` on the receiver. Idempotent.
struct optim_drop {
  std::uint64_t id = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, optim_drop& x) {
  return f(caf::meta::type_name("troupe.dist_autograd.optim_drop"), x.id);
}

/// The answer of an optimizer message: the parameters a step updated (0 for the others).
struct optim_reply {
  std::int32_t value = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, optim_reply& x) {
  return f(caf::meta::type_name("troupe.dist_autograd.optim_reply"), x.value);
}

/// The service as its peers see it.
using service_actor = caf::typed_actor<caf::replies_to<propagate_request>::with<propagate_reply>,
                                       caf::replies_to<release_request>::with<release_reply>,
                                       caf::replies_to<optim_create>::with<optim_reply>,
                                       caf::replies_to<optim_step>::with<optim_reply>,
                                       caf::replies_to<optim_drop>::with<optim_reply>>;
/// The service as its own container sees it.
using service_local = service_actor;

inline propagate_reply to_reply(const propagate_answer& a) { return {std::get<0>(a), std::get<1>(a), std::get<2>(a)}; }
inline propagate_answer to_answer(const propagate_reply& r) { return {r.state, r.code, r.text}; }

/// Spawns the service of container `c` (detached) on `n`'s actor system. It holds `c` weakly.
service_local spawn_service(node& n, std::weak_ptr<container::impl> c);

/// Whether the message types of the service are announced on `n`'s actor system.
bool message_types_announced(node& n);

}  // namespace troupe::dist_autograd

