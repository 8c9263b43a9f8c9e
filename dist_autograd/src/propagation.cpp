// PropagateGradients (Notes [FAST mode backward] in fast_engine.hpp and [context actor] in
// context_actor.hpp): the context actor's side (send, retry on actor timers, await a run's
// propagations, answer duplicates). The handler on the receiving worker is
// container::impl::on_propagate (container_impl.cpp).
#include <algorithm>

#include <caf/all.hpp>

#include "container_impl.hpp"
#include "context_actor_state.hpp"
#include "fast_engine.hpp"
#include "service.hpp"
#include "troupe/actors/error_caf.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::dist_autograd {

std::chrono::milliseconds propagation_bound(const container_options& opts) {
  return opts.backward_timeout + opts.propagate_timeout + opts.backoff * 64 * opts.attempts + std::chrono::seconds(1);
}

propagate_answer propagation_failure(errc code, const std::string& text) {
  return {propagate_failed, static_cast<std::int32_t>(code), text};
}

namespace {

/// The receiver's failure as seen here: peer_lost and timeout keep their code (a worker lost hops
/// away is still peer_lost at the root); anything else is a remote_exception naming `to`.
propagate_answer from_remote(const std::string& to, const propagate_answer& a) {
  const auto c = static_cast<errc>(std::get<1>(a));
  if (c == errc::peer_lost || c == errc::timeout) return a;
  return propagation_failure(errc::remote_exception, "dist_autograd backward on " + to + ": " + std::get<2>(a));
}

/// Answers group `id` once it was awaited and every propagation it handed over ended.
void finish_group(context_self self, std::uint64_t id) {
  auto& s = self->state;
  auto it = s.groups.find(id);
  if (it == s.groups.end() || !it->second.awaited || it->second.ended < it->second.expected) return;
  propagation_group g = std::move(it->second);
  s.groups.erase(it);
  const propagate_answer& answer = std::get<0>(g.local) == propagate_failed ? g.local : g.first_failure;
  if (g.key != std::pair<message_id, std::uint64_t>{0, 0}) {  // an incoming propagation: its duplicates too
    auto& in = s.incoming[g.key];
    in.known = true;
    in.answer = answer;
    for (auto& [park, waiter] : in.parked) (*waiter)(answer);
    in.parked.clear();
  }
  if (g.done) (*g.done)(answer);
}

/// Outgoing propagation `seq` ended with `answer` (done or failed).
void end_propagation(context_self self, std::uint64_t seq, const propagate_answer& answer) {
  auto& s = self->state;
  auto it = s.out.find(seq);
  if (it == s.out.end()) return;
  const std::uint64_t group = it->second.group;
  s.out.erase(it);
  auto& g = s.groups[group];
  ++g.ended;
  if (std::get<0>(answer) == propagate_failed && std::get<0>(g.first_failure) != propagate_failed) g.first_failure = answer;
  finish_group(self, group);
}

/// The outcome of attempt `attempt` of outgoing propagation `seq`: the receiver's answer
/// (done / running / failed), or (propagate_attempt_failed, errc, text) when the request failed.
void on_reply(context_self self, std::uint64_t seq, int attempt, const propagate_answer& answer) {
  auto& s = self->state;
  auto it = s.out.find(seq);
  if (it == s.out.end()) return;
  auto& p = it->second;
  const auto [state, code, text] = answer;
  if (state == propagate_done) return end_propagation(self, seq, answer);
  if (state == propagate_failed) return end_propagation(self, seq, from_remote(p.to, answer));
  if (attempt != p.attempt) return;  // a late non-answer of an earlier attempt: the current one decides
  const auto delay = s.opts.backoff * (1 << std::min(p.attempt - 1, 6));
  const bool late = std::chrono::steady_clock::now() + delay > p.give_up;
  if (state == propagate_running) {  // the receiver still works on it: poll again, bounded
    if (!late) return self->delayed_send(self, delay, ctx_pretry_atom::value, seq);
    return end_propagation(self, seq,
                           propagation_failure(errc::timeout, "dist_autograd: the propagation of message " + std::to_string(p.msg) +
                                                      " to " + p.to + " did not finish within backward_timeout"));
  }
  const auto c = static_cast<errc>(code);  // the attempt's request failed
  if (c == errc::timeout && ++p.timeouts < s.opts.attempts && !late)
    return self->delayed_send(self, delay, ctx_pretry_atom::value, seq);
  if (c == errc::peer_lost) {
    std::lock_guard<std::mutex> lock(s.record->m);
    s.record->lost.insert(p.to);
  }
  const std::string why = c == errc::timeout ? "dist_autograd: the propagation of message " + std::to_string(p.msg) +
                                                   " to " + p.to + " timed out " + std::to_string(p.attempt) +
                                                   " time(s); the last: " + text
                                             : text;
  end_propagation(self, seq, {propagate_failed, code, why});
}

/// Makes the next attempt of outgoing propagation `seq`: a request to the receiver's service.
void send_propagation(context_self self, std::uint64_t seq) {
  auto& s = self->state;
  auto& p = s.out.at(seq);
  const int attempt = ++p.attempt;
  watch(self, p.peer, p.to);
  self->request(caf::actor_cast<service_actor>(p.peer), s.opts.propagate_timeout,
                propagate_request{s.record->id, p.msg, p.pass, attempt, p.retain, p.grads})
      .then([self, seq, attempt](const propagate_reply& r) { on_reply(self, seq, attempt, to_answer(r)); },
            [self, seq, attempt, to = p.to](const caf::error& e) {
              const error err = from_caf_error(e, "dist_autograd::propagate to " + to);
              on_reply(self, seq, attempt, {propagate_attempt_failed, static_cast<std::int32_t>(err.code()), err.message()});
            });
}

}  // namespace

void on_start(context_self self, ctx_start& p) {
  auto& s = self->state;
  const auto give_up = std::chrono::steady_clock::now() + s.opts.backward_timeout;
  auto& out = s.out.emplace(p.seq, outgoing_propagation{p.group, std::move(p.to), std::move(p.peer), p.msg, p.pass,
                                                        p.retain, std::move(p.grads), 0, 0, give_up})
                  .first->second;
  if (!p.first) return send_propagation(self, p.seq);
  out.attempt = 1;  // Note [direct requests]: the run's thread made it; its answer decides from here
  watch(self, out.peer, out.to);
  on_reply(self, p.seq, 1, *p.first);
}

void on_peer_down(context_self self, const std::string& worker, errc code, const std::string& why) {
  std::vector<std::uint64_t> gone;
  for (const auto& [seq, p] : self->state.out)
    if (p.to == worker) gone.push_back(seq);
  for (auto seq : gone) end_propagation(self, seq, propagation_failure(code, why));
}

void on_propagate_retry(context_self self, std::uint64_t seq) {
  if (self->state.out.count(seq)) send_propagation(self, seq);
}

void on_await(context_self self, ctx_await& w) {
  auto& s = self->state;
  auto& g = s.groups[w.group];
  g.awaited = true;
  g.expected = w.count;
  g.local = std::move(w.local);
  g.key = w.key;
  g.done = std::move(w.done);
  finish_group(self, w.group);
}

void on_duplicate(context_self self, ctx_duplicate& d) {
  auto& s = self->state;
  auto& in = s.incoming[d.key];
  if (in.known) return (*d.done)(in.answer);
  const std::uint64_t park = ++s.next_park;
  in.parked.emplace(park, std::move(d.done));
  // Polled again by the sender after `running`: the answer waits at most half an attempt here.
  self->delayed_send(self, s.opts.propagate_timeout / 2, ctx_running_atom::value, park);
}

void on_running_timeout(context_self self, std::uint64_t park) {
  for (auto& [key, in] : self->state.incoming) {
    auto it = in.parked.find(park);
    if (it == in.parked.end()) continue;
    (*it->second)(propagate_answer{propagate_running, 0, {}});
    in.parked.erase(it);
    return;
  }
}

// ---- the receiving worker's handler --------------------------------------------------------------

}  // namespace troupe::dist_autograd
