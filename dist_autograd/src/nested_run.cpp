// A served run's propagations without the context actor on their common path (Note [direct
// requests] in direct_requester.hpp).
#include "nested_run.hpp"

#include <caf/all.hpp>

#include "context_actor.hpp"
#include "direct_requester.hpp"
#include "service.hpp"

namespace troupe::dist_autograd {

nested_run::nested_run(std::weak_ptr<container::impl> c, std::shared_ptr<context_state> ctx, std::uint64_t group,
                       std::uint64_t pass, bool retain)
    : c_(std::move(c)), ctx_(std::move(ctx)), group_(group), pass_(pass), retain_(retain) {}

void nested_run::send(const std::string& to, caf::actor peer, message_id msg, const tensor_list& grads) {
  auto c = c_.lock();
  if (!c) throw error(errc::invalid_state, "dist_autograd: the container ended during a backward");
  std::size_t slot = 0;
  {
    std::lock_guard<std::mutex> lock(m_);
    slot = attempts_.size();
    attempts_.push_back({{c->new_id(), to, peer, msg, grads}, std::nullopt});
  }
  // The reply, an error, or (past the deadline) an empty message comes to on_reply.
  c->requester->request(peer, caf::make_message(propagate_request{ctx_->id, msg, pass_, 1, retain_, grads}),
                        [self = shared_from_this(), slot](caf::message&& reply) { self->on_reply(slot, std::move(reply)); },
                        std::chrono::steady_clock::now() + c->opts.propagate_timeout);
}

void nested_run::close(propagate_answer local, std::pair<message_id, std::uint64_t> key,
                       answer_ptr<propagate_answer> done) {
  {
    std::lock_guard<std::mutex> lock(m_);
    closed_ = true;
    local_ = std::move(local);
    key_ = key;
    done_ = std::move(done);
    if (!ready()) return;
  }
  finish();
}

void nested_run::on_reply(std::size_t slot, caf::message&& reply) {
  {
    std::lock_guard<std::mutex> lock(m_);
    auto& a = attempts_[slot];
    if (a.answer) return;
    a.answer = first_answer(reply, a.to);
    ++answered_;
    if (!ready()) return;
  }
  finish();
}

bool nested_run::ready() {
  if (!closed_ || finished_ || answered_ < attempts_.size()) return false;
  finished_ = true;
  return true;
}

// Runs once, after ready(): nothing changes the attempts any more.
void nested_run::finish() {
  for (const auto& a : attempts_)
    if (std::get<0>(*a.answer) != propagate_done) return hand_over();
  answer_here(local_);
}

// As a run that started nothing: the record keeps the outcome for duplicates; a duplicate parked
// in the actor meanwhile learns it from there.
void nested_run::answer_here(const propagate_answer& outcome) {
  bool parked = false;
  {
    std::lock_guard<std::mutex> lock(ctx_->m);
    auto& seen = ctx_->handled[key_];
    seen.known = true;
    seen.outcome = outcome;
    parked = seen.parked;
  }
  (*done_)(outcome);
  if (!parked) return;
  auto c = c_.lock();
  if (!c) return;
  caf::anon_send(caf::actor_cast<context_handle>(c->actor_of(ctx_->id)), ctx_await{group_, 0, outcome, key_, nullptr});
}

// The actor goes on from each answer that was not done (retries, polls, failures) and answers.
void nested_run::hand_over() {
  auto c = c_.lock();
  if (!c) return;  // done_ goes with this object and answers its fallback
  const auto actor = caf::actor_cast<context_handle>(c->actor_of(ctx_->id));
  if (!actor) return;  // released meanwhile: the same
  std::size_t count = 0;
  for (auto& a : attempts_) {
    if (std::get<0>(*a.answer) == propagate_done) continue;
    caf::anon_send(actor, ctx_start{group_, a.seq, a.to, a.peer, a.msg, pass_, retain_, a.grads, a.answer});
    ++count;
  }
  caf::anon_send(actor, ctx_await{group_, count, local_, key_, std::move(done_)});
}

}  // namespace troupe::dist_autograd
