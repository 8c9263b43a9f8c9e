// The handles of rref<T>: passing one on (a child with the parent's hold, G2), binding one that
// arrived, releasing one (G1). Also probing for lost carriers (Note [RRef protocol] in
// rref/context.hpp). The state lives in the actors; these functions message them.
#include <caf/all.hpp>

#include "context_impl.hpp"
#include "troupe/actors/rpc/api.hpp"

namespace troupe::rref_detail {

namespace {
const std::string no_caller;
}  // namespace

void watch_remote(const handle& h) {
  if (h.watch) std::call_once(h.watch_once, [&h] { std::exchange(h.watch, {})(false); });
}

namespace {

// watch_remote for a handle being released: true when the release went with remote_done.
bool watch_and_release(const handle& h) {
  bool sent = false;
  if (h.watch) std::call_once(h.watch_once, [&] { sent = std::exchange(h.watch, {})(true); });
  return sent;
}

}  // namespace

handle::~handle() {
  // Before the release: a completed remote_call confirms the fork first, in the same message.
  const bool released = watch_and_release(*this);
  if (!bound || !ctx || failed != errc::ok) return;
  {
    std::lock_guard<std::mutex> lock(ctx->mutex_);
    if (ctx->closed_) return;
  }
  if (owner_local) {
    if (auto a = ctx->owner_for(id, false)) caf::anon_send(*a, rref_msg::local_ref_atom::value, std::int32_t{-1});
  } else if (released) {
    return;
  } else if (auto u = ctx->user_for({id, fork})) {
    ctx->hand_release(*u, std::nullopt);  // through the courier, one window later (Note [release batching])
  }
}

void probe(context_impl& c, const std::string& to, std::vector<send_scope::sent> forks) {
  for (auto& f : forks) {
    rref_msg::probe_start m{f.token, to};
    if (f.parent_fork.empty()) {
      if (auto a = c.owner_for(f.id, false)) caf::anon_send(*a, m);
    } else if (auto u = c.user_for({f.id, f.parent_fork})) {
      caf::anon_send(*u, m);
    }
  }
}

rref_msg::wire fork_for_send(const handle& h, const rpc::codec_context& ctx) {
  if (!h.bound || !h.ctx) throw error(errc::invalid_state, "rref " + h.id.str() + " is not bound to an rref_context and cannot be passed on");
  if (h.failed != errc::ok) throw error(h.failed, h.failure);
  if (ctx.stored)
    throw error(errc::not_supported, "rref " + h.id.str() + " inside the value of another rref (remote result, make_rref, method object)");
  auto* sent = dynamic_cast<send_scope*>(ctx.handles);
  auto& c = *h.ctx;
  const auto child = c.next_id();
  const auto token = c.next_id();
  rref_msg::wire w{h.id, h.owner, fork_id{c.me_, child}, c.me_, h.owner_local ? fork_id{} : h.fork, token};
  // An argument is probed by its sender if the call fails. A result is probed by us once it had
  // ample time to be bound: a lost reply, the discarded reply of a duplicated request.
  const auto& caller = sent || !ctx.reply_to ? no_caller : *ctx.reply_to;
  rref_msg::child_hold hold{token, w.fork, caller, c.opts_.result_probe_after.count()};
  if (h.owner_local) {
    auto a = c.owner_for(h.id, false);
    if (!a) throw error(errc::invalid_state, "rref " + h.id.str() + " was deleted by its owner " + c.me_);
    caf::anon_send(*a, hold);  // the local handle keeps the actor alive; the ack comes later
  } else {
    watch_remote(h);
    auto u = c.user_for({h.id, h.fork});
    if (!u) throw error(errc::invalid_state, "rref " + h.id.str() + ": fork " + h.fork.str() + " is not held by " + c.me_);
    auto a = c.ask<rref_msg::hold_answer>(*u, answers_at_once, hold);
    if (!a) throw error(errc::timeout, "rref " + h.id.str() + ": its fork context on " + c.me_ + " did not answer");
    if (a->code != 0) throw error(static_cast<errc>(a->code), a->message);
  }
  if (sent) sent->add({w.id, w.fork, token, w.parent_fork});
  return w;
}

namespace {

std::shared_ptr<handle> failed_handle(std::shared_ptr<handle> h, std::string why) {
  h->failed = errc::invalid_state;
  h->failure = std::move(why);
  return h;
}

// An RRef that arrived at its owner becomes a local reference; the parent is acked at once.
std::shared_ptr<handle> bind_at_owner(context_impl& c, std::shared_ptr<handle> h, const rref_msg::wire& w) {
  std::optional<owner_rref_actor> a;
  {
    std::lock_guard<std::mutex> lock(c.mutex_);
    c.owner_bound_.add({w.id, w.fork}, std::chrono::steady_clock::now(), c.opts_.tombstone_ttl);
    if (!c.deleted_owners_.contains(w.id)) {
      // It may arrive before the remote_call that creates the value: a PENDING owner then.
      a = c.entry_for(w.id).actor;
    }
    if (a) {
      ++c.local_refs_on_way_[w.id];  // the actor may not delete before it took this reference
      caf::anon_send(*a, rref_msg::local_ref_atom::value, std::int32_t{1});
    }
  }
  if (!a) h = failed_handle(std::move(h), "rref " + w.id.str() + " arrived at its owner " + c.me_ + " after it was deleted");
  else h->owner_local = true;
  c.send_ack(w.parent, rref_msg::child_ack{w.id, w.parent_fork, w.parent_hold});
  return h;
}

}  // namespace

std::shared_ptr<handle> bind(context_impl& c, const rref_msg::wire& w) {
  auto h = std::make_shared<handle>();
  h->ctx = c.shared_from_this();
  h->id = w.id;
  h->owner = w.owner;
  h->bound = true;
  const fork_key k{w.id, w.fork};
  std::optional<user_rref_actor> existing;
  {
    std::lock_guard<std::mutex> lock(c.mutex_);
    if (c.closed_) return failed_handle(std::move(h), "rref " + w.id.str() + " arrived after the rref context of " + c.me_ + " closed");
    if (c.abandoned_.contains(k))
      return failed_handle(std::move(h), "rref " + w.id.str() + " fork " + w.fork.str() + " arrived after its sender gave the call up as lost");
  }
  if (w.owner == c.me_) return bind_at_owner(c, std::move(h), w);
  h->fork = w.fork;
  {
    std::lock_guard<std::mutex> lock(c.mutex_);
    if (c.gone_users_.contains(k))
      return failed_handle(std::move(h), "rref " + w.id.str() + " fork " + w.fork.str() + ": a stale duplicate of a fork already released");
    auto it = c.users_.find(k);
    if (it == c.users_.end()) {
      c.users_.emplace(k, spawn_user_rref(c, w.id, w.fork, user_origin{w.owner, false, w.parent, w.parent_fork, w.parent_hold}));
      return h;
    }
    existing = it->second;
  }
  // A duplicate carrier of a fork held here: one more hold, unless the fork is being deleted.
  auto a = c.ask<rref_msg::hold_answer>(*existing, answers_at_once, rref_msg::carrier{w.parent, w.parent_fork, w.parent_hold});
  if (!a || a->code != 0) {
    h = failed_handle(std::move(h), a ? a->message : "rref " + w.id.str() + ": its fork context did not answer");
    c.send_ack(w.parent, rref_msg::child_ack{w.id, w.parent_fork, w.parent_hold});
  }
  return h;
}

bool confirmed(const handle& h) {
  if (!h.bound || !h.ctx) return false;
  if (h.owner_local) return true;
  watch_remote(h);
  auto u = h.ctx->user_for({h.id, h.fork});
  if (!u) return true;  // already deleting: it was confirmed
  auto a = h.ctx->ask<rref_msg::hold_answer>(*u, answers_at_once, rref_msg::status_atom::value);
  return a && a->confirmed;
}

node& node_of(const handle& h) {
  if (!h.bound || !h.ctx) throw error(errc::invalid_state, "rref " + h.id.str() + " is not bound to an rref_context");
  return *h.ctx->n_;
}

}  // namespace troupe::rref_detail
