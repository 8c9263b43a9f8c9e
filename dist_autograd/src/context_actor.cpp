// The context actor: state, behaviour and the release (Note [context actor] in context_actor.hpp);
// its PropagateGradients handlers are in propagation.cpp.
#include "context_actor.hpp"

#include <algorithm>

#include <caf/all.hpp>

#include "context_actor_state.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::dist_autograd {

namespace {

void send_attempt(context_self self, const std::string& worker) {
  auto& s = self->state;
  ++s.attempts[worker];
  context_handle me = caf::actor_cast<context_handle>(self);
  try {
    auto f = rpc_async<std::int32_t>(*s.n, worker, release_name, rpc::deadline{s.opts.release_timeout}, s.record->id,
                                     s.n->info().name);
    f.then_inline([me, worker](const rpc::future<std::int32_t>& done) {  // only a message: no executor hop
      std::int32_t code = 0;
      try {
        done.get();
      } catch (const error& e) {
        code = static_cast<std::int32_t>(e.code());
      }
      caf::anon_send(me, ctx_release_ack{worker, code});
    });
  } catch (const error& e) {  // the node is stopping or the peer cannot be resolved
    caf::anon_send(me, ctx_release_ack{worker, static_cast<std::int32_t>(e.code())});
  }
}

/// Answers every waiting release once nothing is pending; quits after a final one.
void finish_if_done(context_self self) {
  auto& s = self->state;
  if (!s.pending.empty()) return;
  for (auto& w : s.waiting) (*w)(s.released);
  s.waiting.clear();
  s.attempts.clear();
  if (s.final) self->quit();
}

void on_release(context_self self, ctx_release& r) {
  auto& s = self->state;
  s.final = s.final || r.final;
  std::set<std::string> targets;
  {
    std::lock_guard<std::mutex> lock(s.record->m);
    for (const auto& w : s.record->workers)
      if (w != r.except && !s.record->lost.count(w) && !r.released.count(w)) targets.insert(w);
  }
  if (r.done) s.waiting.push_back(std::move(r.done));
  for (const auto& w : targets)
    if (s.pending.insert(w).second) send_attempt(self, w);
  finish_if_done(self);
}

void on_ack(context_self self, const ctx_release_ack& a) {
  auto& s = self->state;
  if (!s.pending.count(a.worker)) return;
  const int made = s.attempts[a.worker];
  if (a.code == static_cast<std::int32_t>(errc::timeout) && made < s.opts.attempts) {
    self->delayed_send(self, s.opts.backoff * (1 << std::min(made - 1, 6)), ctx_retry_atom::value, a.worker);
    return;
  }
  if (a.code == 0) ++s.released;
  s.pending.erase(a.worker);  // released, or gone / refusing: nothing is left to release there
  finish_if_done(self);
}

context_handle::behavior_type context_actor(context_self self, node* n, container_options opts,
                                            std::shared_ptr<context_state> record) {
  self->state.n = n;
  self->state.opts = opts;
  self->state.record = std::move(record);
  return {
      [self](ctx_release& r) { on_release(self, r); },
      [self](const ctx_release_ack& a) { on_ack(self, a); },
      [self](ctx_retry_atom, const std::string& worker) {
        if (self->state.pending.count(worker)) send_attempt(self, worker);
      },
      [self](const ctx_propagate_ack& a) { on_propagate_ack(self, a); },
      [self](ctx_pretry_atom, std::uint64_t seq) { on_propagate_retry(self, seq); },
      [self](ctx_await& w) { on_await(self, w); },
      [self](ctx_duplicate& d) { on_duplicate(self, d); },
      [self](ctx_running_atom, std::uint64_t park) { on_running_timeout(self, park); },
  };
}

}  // namespace

// lazy_init: initialised by its first message, so a spawn wakes no scheduler thread (one per
// context per worker, on the forward's path).
context_handle spawn_context_actor(node& n, const container_options& opts, std::shared_ptr<context_state> record) {
  return n.system().spawn<caf::lazy_init>(context_actor, &n, opts, std::move(record));
}

void release_through(const container_options& opts, const context_handle& a, const std::string& except, bool final,
                     std::set<std::string> released) {
  if (!a) return;
  // The actor's own bound: every attempt's deadline plus the backoffs, and a margin.
  const auto bound = (opts.release_timeout + opts.backoff * 64) * opts.attempts + std::chrono::seconds(1);
  answer_waiter<std::int32_t> w;
  caf::anon_send(a, ctx_release{except, final, w.callback(0), std::move(released)});  // gone: answers 0
  std::int32_t count = 0;
  w.wait_for(std::chrono::duration_cast<std::chrono::milliseconds>(bound), count);
}

void stop_context_actors(node& n, const std::vector<context_handle>& actors) {
  if (actors.empty()) return;
  try {
    caf::scoped_actor self{n.system()};
    for (const auto& a : actors) {
      self->monitor(a);
      self->send_exit(a, caf::exit_reason::user_shutdown);
    }
    std::size_t left = actors.size();
    bool timed_out = false;
    while (left > 0 && !timed_out)
      self->receive([&](const caf::down_msg&) { --left; }, caf::after(std::chrono::seconds(5)) >> [&] { timed_out = true; });
  } catch (...) {  // the node is gone: its system took the actors with it
  }
}

}  // namespace troupe::dist_autograd
