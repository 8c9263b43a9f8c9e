// The user side of the RRef protocol: fork entries, G1/G2, binding received RRefs, to_here
// (Note [RRef protocol] in rref/context.hpp).
#include "context_impl.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/rref/caller.hpp"

namespace troupe::rref_detail {

namespace {

using actions = std::vector<std::function<void()>>;

void run(actions& a) {
  for (auto& f : a) f();
}

}  // namespace

// Under mutex_: once confirmed, acks go to the parents; once confirmed with no hold, the fork
// is deleted (G1). Returns the sends to do after unlocking.
static actions settle(context_impl& c, const fork_key& k) {
  actions out;
  auto it = c.users_.find(k);
  if (it == c.users_.end() || !it->second.confirmed) return out;
  auto& e = it->second;
  for (const auto& [parent, token] : e.acks) out.push_back([&c, parent = parent, id = k.first, token = token] { c.send_ack(parent, id, token); });
  e.acks.clear();
  if (e.holds > 0) return out;
  if (e.failed == errc::ok) {
    ++c.stats_.user_deletes;
    out.push_back([&c, owner = e.owner, k] {
      c.send_control(owner, "troupe.rref.user_delete", rref_msg::user_delete{k.first, k.second}, [](errc, std::vector<char>) {});
    });
  }
  c.users_.erase(it);
  c.gone_users_.insert(k);
  c.changed_.notify_all();
  return out;
}

void context_impl::confirm(const fork_key& k, errc failed, const std::string& why) {
  actions a;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = users_.find(k);
    if (it == users_.end() || it->second.confirmed) return;
    it->second.confirmed = true;
    it->second.failed = failed;
    it->second.failure = why;
    a = settle(*this, k);
  }
  changed_.notify_all();
  run(a);
}

void context_impl::release_fork(const fork_key& k) {
  actions a;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = users_.find(k);
    if (it == users_.end()) return;
    --it->second.holds;
    a = settle(*this, k);
  }
  run(a);
}

void context_impl::release_token(std::uint64_t token) {
  fork_key k;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = tokens_.find(token);
    if (it == tokens_.end()) return;  // a duplicate ack
    k = it->second;
    tokens_.erase(it);
    if (k.second.empty()) {  // a child of the owner itself
      auto o = owners_.find(k.first);
      if (o != owners_.end()) o->second.children.erase(token);
      maybe_delete_owner(k.first);
      return;
    }
    auto u = users_.find(k);
    if (u != users_.end()) u->second.children.erase(token);
  }
  release_fork(k);
}

std::int32_t context_impl::on_child_ack(const rref_msg::child_ack& m) {
  release_token(m.token);
  return 0;
}

std::int32_t context_impl::on_fork_probe(const rref_msg::fork_probe& m) {
  std::lock_guard<std::mutex> lock(mutex_);
  const fork_key k{m.id, m.fork};
  if (users_.count(k) || gone_users_.count(k) || owner_bound_.count(k)) return 1;
  abandoned_.insert(k);
  return 0;
}

namespace {
thread_local send_scope* tls_send = nullptr;
thread_local bool tls_storing = false;
}  // namespace

storing_scope::storing_scope() : previous_(tls_storing) { tls_storing = true; }
storing_scope::~storing_scope() { tls_storing = previous_; }
bool storing_scope::active() { return tls_storing; }

send_scope::send_scope(context_impl*, std::string) : previous_(tls_send) { tls_send = this; }
send_scope::~send_scope() {
  if (active_) tls_send = previous_;
}
std::vector<send_scope::sent> send_scope::take() {
  if (active_) tls_send = previous_;
  active_ = false;
  return std::move(sent_);
}
send_scope* send_scope::current() { return tls_send; }

void probe(context_impl& c, const std::string& to, std::vector<send_scope::sent> forks) {
  for (auto& f : forks) {
    std::weak_ptr<context_impl> weak = c.shared_from_this();
    c.send_control(to, "troupe.rref.fork_probe", rref_msg::fork_probe{f.id, f.fork}, [weak, token = f.token](errc code, std::vector<char> reply) {
      auto self = weak.lock();
      if (!self) return;
      const bool received = code == errc::ok && rpc::decode_result<std::int32_t>(reply, "fork_probe") == 1;
      if (!received && (code == errc::ok || code == errc::peer_lost)) self->release_token(token);
    });
  }
}

void context_impl::send_ack(const std::string& parent, const rref_id& id, std::uint64_t token) {
  if (parent == me_) {
    release_token(token);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.child_acks;
  }
  send_control(parent, "troupe.rref.child_ack", rref_msg::child_ack{id, token}, [](errc, std::vector<char>) {});
}

void context_impl::send_fork_request(const fork_key& k) {
  std::string owner;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = users_.find(k);
    if (it == users_.end()) return;
    owner = it->second.owner;
    ++stats_.fork_requests;
  }
  std::weak_ptr<context_impl> weak = shared_from_this();
  send_control(owner, "troupe.rref.fork_request", rref_msg::fork_request{k.first, k.second}, [weak, k, owner](errc c, std::vector<char> reply) {
    auto self = weak.lock();
    if (!self) return;
    if (c == errc::ok && rpc::decode_result<std::int32_t>(reply, "fork_request") == 0) return self->confirm(k, errc::ok, {});
    if (c == errc::ok) return self->confirm(k, errc::invalid_state, "rref " + k.first.str() + " was deleted by its owner " + owner);
    if (c == errc::peer_lost) return self->confirm(k, errc::owner_lost, "owner " + owner + " of rref " + k.first.str() + " is lost");
    self->confirm(k, c, "fork_request of rref " + k.first.str() + " to " + owner + " failed: " + std::string(to_string(c)));
  });
}

handle::~handle() {
  if (!bound || !ctx || failed != errc::ok) return;
  {
    std::lock_guard<std::mutex> lock(ctx->mutex_);
    if (ctx->closed_) return;
    if (owner_local) {
      auto it = ctx->owners_.find(id);
      if (it != ctx->owners_.end()) --it->second.local;
      ctx->maybe_delete_owner(id);
      return;
    }
  }
  ctx->release_fork({id, fork});
}

// Under c.mutex_: a fresh fork of `h` for a receiver and the parent's hold on it.
static rref_msg::wire new_child(context_impl& c, const handle& h) {
  rref_msg::wire w{h.id, h.owner, fork_id{c.me_, c.next_++}, c.me_, c.next_++};
  if (h.owner_local) {
    c.owners_[h.id].children.insert(w.parent_hold);
    c.tokens_[w.parent_hold] = {h.id, fork_id{}};
    return w;
  }
  auto it = c.users_.find({h.id, h.fork});
  if (it == c.users_.end()) throw error(errc::invalid_state, "rref " + h.id.str() + ": fork " + h.fork.str() + " is not held by " + c.me_);
  if (it->second.failed != errc::ok) throw error(it->second.failed, it->second.failure);
  ++it->second.holds;
  it->second.children.insert(w.parent_hold);
  c.tokens_[w.parent_hold] = {h.id, h.fork};
  return w;
}

rref_msg::wire fork_for_send(const handle& h) {
  if (!h.bound || !h.ctx) throw error(errc::invalid_state, "rref " + h.id.str() + " is not bound to an rref_context and cannot be passed on");
  if (h.failed != errc::ok) throw error(h.failed, h.failure);
  if (storing_scope::active() && !send_scope::current())  // (an rpc through the context inside remote's function is fine)
    throw error(errc::not_supported, "rref " + h.id.str() + " inside the value of another rref (remote result, make_rref, method object)");
  auto& c = *h.ctx;
  rref_msg::wire w;
  {
    std::lock_guard<std::mutex> lock(c.mutex_);
    w = new_child(c, h);
  }
  send_scope::sent s{w.id, w.fork, w.parent_hold};
  if (auto* scope = send_scope::current()) {
    scope->add(s);  // an argument: probed if the call fails
  } else if (const auto& caller = current_caller(); !caller.empty()) {
    // A result: its reply may be lost or discarded (duplicated request), so probe the caller
    // once it has had ample time to bind it.
    std::weak_ptr<context_impl> weak = c.shared_from_this();
    c.after(c.result_probe_after_, [weak, caller = caller, s] {
      auto self = weak.lock();
      if (!self) return;
      {
        std::lock_guard<std::mutex> lock(self->mutex_);
        if (!self->tokens_.count(s.token)) return;  // acked: the usual case costs no probe
      }
      probe(*self, caller, {s});
    });
  }
  return w;
}

std::shared_ptr<handle> bind(context_impl& c, const rref_msg::wire& w) {
  auto h = std::make_shared<handle>();
  h->ctx = c.shared_from_this();
  h->id = w.id;
  h->owner = w.owner;
  h->bound = true;
  bool request = false;
  actions flush;
  {
    std::lock_guard<std::mutex> lock(c.mutex_);
    if (c.abandoned_.count({w.id, w.fork})) {
      h->failed = errc::invalid_state;
      h->failure = "rref " + w.id.str() + " fork " + w.fork.str() + " arrived after its sender gave the call up as lost";
      return h;
    }
    if (w.owner == c.me_) {
      c.owner_bound_.insert({w.id, w.fork});
      auto* e = c.owner_for(w.id);
      if (!e) {
        h->failed = errc::invalid_state;
        h->failure = "rref " + w.id.str() + " arrived at its owner " + c.me_ + " after it was deleted";
      } else {
        ++e->local;
        h->owner_local = true;
      }
    } else {
      const fork_key k{w.id, w.fork};
      h->fork = w.fork;
      if (c.gone_users_.count(k)) {
        h->failed = errc::invalid_state;
        h->failure = "rref " + w.id.str() + " fork " + w.fork.str() + ": a stale duplicate of a fork already released";
        return h;
      }
      auto [it, fresh] = c.users_.try_emplace(k);
      it->second.owner = w.owner;
      ++it->second.holds;
      it->second.acks.emplace_back(w.parent, w.parent_hold);
      request = fresh;
      if (!fresh) flush = settle(c, k);  // a duplicate carrier: ack again if already confirmed
    }
  }
  if (h->owner_local || h->failed != errc::ok) c.send_ack(w.parent, w.id, w.parent_hold);
  else if (request) c.send_fork_request({w.id, w.fork});
  run(flush);
  return h;
}

bool confirmed(const handle& h) {
  if (!h.bound || !h.ctx) return false;
  if (h.owner_local) return true;
  std::lock_guard<std::mutex> lock(h.ctx->mutex_);
  auto it = h.ctx->users_.find({h.id, h.fork});
  return it == h.ctx->users_.end() || it->second.confirmed;
}

node& node_of(const handle& h) {
  if (!h.bound || !h.ctx) throw error(errc::invalid_state, "rref " + h.id.str() + " is not bound to an rref_context");
  return *h.ctx->n_;
}

}  // namespace troupe::rref_detail
