// The context actor: state, behaviour and the release (Note [context actor] in context_actor.hpp);
// its PropagateGradients handlers are in propagation.cpp.
#include "context_actor.hpp"

#include <algorithm>

#include <caf/all.hpp>

#include "context_actor_state.hpp"
#include "service.hpp"
#include "troupe/actors/error_caf.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::dist_autograd {

namespace {

void on_ack(context_self self, const std::string& worker, std::int32_t code);

void send_attempt(context_self self, const std::string& worker) {
  auto& s = self->state;
  ++s.attempts[worker];
  auto it = s.peers.find(worker);
  if (it == s.peers.end() || !it->second) return on_ack(self, worker, static_cast<std::int32_t>(errc::peer_lost));
  const auto peer = caf::actor_cast<service_actor>(it->second);
  watch(self, it->second, worker);
  self->request(peer, s.opts.release_timeout, release_request{s.record->id, s.n->info().name})
      .then([self, worker](const release_reply&) { on_ack(self, worker, 0); },
            [self, worker](const caf::error& e) {
              on_ack(self, worker, static_cast<std::int32_t>(from_caf_error(e, "release").code()));
            });
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
  for (auto& [w, h] : r.peers) s.peers[w] = std::move(h);
  std::set<std::string> targets;
  {
    std::lock_guard<std::mutex> lock(s.record->m);
    for (const auto& w : s.record->workers)
      if (w != r.except && !s.record->lost.count(w) && !r.settled.count(w)) targets.insert(w);
  }
  if (r.done) s.waiting.push_back(std::move(r.done));
  for (const auto& w : targets) {
    if (!s.pending.insert(w).second) continue;
    if (!r.retry.count(w)) {
      send_attempt(self, w);
      continue;
    }
    s.attempts[w] = 1;  // the sender's first attempt timed out (Note [direct requests])
    if (s.opts.attempts > 1) self->delayed_send(self, s.opts.backoff, ctx_retry_atom::value, w);
    else s.pending.erase(w);
  }
  finish_if_done(self);
}

void on_ack(context_self self, const std::string& worker, std::int32_t code) {
  auto& s = self->state;
  if (!s.pending.count(worker)) return;
  const int made = s.attempts[worker];
  if (code == static_cast<std::int32_t>(errc::timeout) && made < s.opts.attempts) {
    self->delayed_send(self, s.opts.backoff * (1 << std::min(made - 1, 6)), ctx_retry_atom::value, worker);
    return;
  }
  if (code == 0) ++s.released;
  s.pending.erase(worker);  // released, or gone / refusing: nothing is left to release there
  finish_if_done(self);
}

/// A monitored service went down: what waits for its worker fails, nothing more goes there.
void on_down(context_self self, const caf::down_msg& d) {
  auto& s = self->state;
  auto it = s.watched.find(d.source);
  if (it == s.watched.end()) return;
  const std::string worker = it->second;
  s.watched.erase(it);
  {
    std::lock_guard<std::mutex> lock(s.record->m);
    s.record->lost.insert(worker);
  }
  const error e = from_caf_error(d.reason, "the dist_autograd service of " + worker);
  const errc code = e.code() == errc::peer_lost ? errc::peer_lost : errc::invalid_state;
  on_peer_down(self, worker, code, "dist_autograd: the service of worker " + worker + " went down: " + e.message());
  if (s.pending.erase(worker) > 0) finish_if_done(self);
}

context_handle::behavior_type context_actor(context_self self, node* n, container_options opts,
                                            std::shared_ptr<context_state> record) {
  self->state.n = n;
  self->state.opts = opts;
  self->state.record = std::move(record);
  self->set_down_handler([self](caf::down_msg& d) { on_down(self, d); });
  return {
      [self](ctx_release& r) { on_release(self, r); },
      [self](ctx_retry_atom, const std::string& worker) {
        if (self->state.pending.count(worker)) send_attempt(self, worker);
      },
      [self](ctx_start& p) { on_start(self, p); },
      [self](ctx_pretry_atom, std::uint64_t seq) { on_propagate_retry(self, seq); },
      [self](ctx_await& w) { on_await(self, w); },
      [self](ctx_duplicate& d) { on_duplicate(self, d); },
      [self](ctx_running_atom, std::uint64_t park) { on_running_timeout(self, park); },
  };
}

}  // namespace

// lazy_init: initialised by its first message, so a spawn wakes no scheduler thread.
context_handle spawn_context_actor(node& n, const container_options& opts, std::shared_ptr<context_state> record) {
  return n.system().spawn<caf::lazy_init>(context_actor, &n, opts, std::move(record));
}

void watch(context_self self, const caf::actor& peer, const std::string& worker) {
  if (self->state.watched.emplace(peer.address(), worker).second) self->monitor(peer);
}

void release_through(const container_options& opts, const context_handle& a, ctx_release r) {
  if (!a) return;
  // The actor's own bound: every attempt's deadline plus the backoffs, and a margin.
  const auto bound = (opts.release_timeout + opts.backoff * 64) * opts.attempts + std::chrono::seconds(1);
  answer_waiter<std::int32_t> w;
  r.done = w.callback(0);
  caf::anon_send(a, std::move(r));  // gone: answers 0
  std::int32_t count = 0;
  w.wait_for(std::chrono::duration_cast<std::chrono::milliseconds>(bound), count);
}

void stop_actors(node& n, const std::vector<caf::actor>& actors) {
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
