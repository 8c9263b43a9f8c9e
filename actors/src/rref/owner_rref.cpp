// The owner_rref actor (Note [owner_rref actor] in owner_rref.hpp).
#include "owner_rref.hpp"

#include <caf/all.hpp>
#include <set>
#include <sstream>

#include "context_impl.hpp"
#include "troupe/actors/rpc/codec.hpp"

namespace troupe::rref_detail {

namespace {

using namespace rref_msg;

struct child_entry {
  fork_id child;
  std::string caller;
};

struct owner_state {
  std::shared_ptr<context_impl> r;  // keeps the router alive while the actor runs (it may outlive rref_context)
  rref_id id;
  bool ready = false, creator_fork_deleted = false, deleted = false;
  std::int32_t code = 0;
  std::string message;
  held_ptr value;
  std::set<fork_id> forks, deleted_forks;
  std::map<std::uint64_t, child_entry> children;  // pending-child tokens of owner-local handles
  int local = 0;
  std::vector<caf::typed_response_promise<held_answer>> parked_local;  // (fetches from other workers park in the router)
  std::uint64_t leased = 0;
  // A vector, not a deque: libstdc++'s empty deque allocates ~600 bytes, paid by every owner.
  std::vector<std::pair<std::uint64_t, caf::typed_response_promise<held_answer>>> lease_queue;
  control_retries ctl;
  bool quitting = false;
};
using owner_self = owner_rref_actor::stateful_pointer<owner_state>;

fork_id creator_fork(const rref_id& id) { return fork_id{id.creator, id.local}; }

held_answer answer_of(const owner_state& s) {
  if (s.code != 0) return held_answer{s.code, s.message, {}};
  return held_answer{0, {}, s.value};
}

std::string deleted_text(const owner_state& s) { return "rref " + s.id.str() + " was deleted by its owner " + s.r->me_; }

held_answer deleted_answer(const owner_state& s) {
  return held_answer{static_cast<std::int32_t>(errc::invalid_state), deleted_text(s), {}};
}

// Installs the router's read-through snapshot of a method's new object (Note [owner_rref actor]).
void publish(owner_state& s) {
  s.r->publish(s.id, std::make_shared<const published_value>(published_value{s.code, s.message, s.value}));
}

void maybe_quit(owner_self self) { request_end(self, self->state.deleted && self->state.ctl.sends.empty()); }

// DELETED once nothing can reach the value any more (Note [owner_rref actor]).
void maybe_delete(owner_self self) {
  auto& s = self->state;
  if (s.deleted) return maybe_quit(self);
  if (!s.forks.empty() || s.local > 0 || !s.children.empty() || s.leased != 0) return;
  if (!s.ready && !s.creator_fork_deleted) return;   // the remote_call may still be on its way
  if (!s.r->owner_gone(s.id)) return;  // the function is running, or a bind of this id is on its way here
  s.deleted = true;                    // (the router failed the fetches parked in its entry)
  for (auto& rp : s.parked_local) rp.deliver(deleted_answer(s));
  s.parked_local.clear();
  for (auto& [lease, rp] : s.lease_queue) rp.deliver(deleted_answer(s));
  s.lease_queue.clear();
  maybe_quit(self);
}

// Hands the value to the next parked method call, one at a time.
void grant_leases(owner_self self) {
  auto& s = self->state;
  while (s.ready && s.leased == 0 && !s.lease_queue.empty()) {
    auto [lease, rp] = std::move(s.lease_queue.front());
    s.lease_queue.erase(s.lease_queue.begin());  // rarely more than a few queued methods
    if (s.code == 0) s.leased = lease;
    rp.deliver(answer_of(s));
  }
}

// The function's thread already published the value and answered the parked remote fetches.
void on_value(owner_self self, value_set& v) {
  auto& s = self->state;
  if (s.ready || s.deleted) return;
  if (!s.deleted_forks.count(v.fork)) s.forks.insert(v.fork);  // a late value never re-adds a deleted fork
  s.ready = true;
  s.code = v.code;
  s.message = std::move(v.message);
  s.value = std::move(v.value);
  for (auto& rp : s.parked_local) rp.deliver(answer_of(s));
  s.parked_local.clear();
  grant_leases(self);
  maybe_delete(self);
}

// A child whose carrier may be lost: ask its node; drop the hold if it never got it.
void probe(owner_self self, std::uint64_t token, const std::string& to) {
  auto& s = self->state;
  auto it = s.children.find(token);
  if (it == s.children.end()) return;
  start_control(self, s.ctl, *s.r, to, fork_probe{s.id, it->second.child},
                [self, token](errc c, std::int32_t reply) {
                  const bool received = c == errc::ok && reply == 1;
                  if (!received && (c == errc::ok || c == errc::peer_lost)) self->state.children.erase(token);
                  maybe_delete(self);
                });
}

std::string summary(const owner_state& s) {
  std::ostringstream o;
  o << "owner " << s.id.str() << " (forks {";
  for (const auto& f : s.forks) o << " " << f.str();
  o << " }, local refs " << s.local << ", pending children " << s.children.size()
    << (s.ready ? ", ready)" : ", pending)");
  return o.str();
}

owner_rref_actor::behavior_type owner_rref(owner_self self, std::shared_ptr<context_impl> r, rref_id id, owner_start start) {
  auto& st = self->state;
  st.r = std::move(r);
  st.id = std::move(id);
  if (start.ready) {
    st.ready = true;
    st.code = start.code;
    st.message = std::move(start.message);
    st.value = std::move(start.value);
    st.local = start.local;
    if (start.fork) st.forks.insert(*start.fork);
  }
  return {
      [self](value_set& v) { on_value(self, v); },
      [self](fork_request& m) -> answer {  // delegated by the service: the owner accept (Note [RRef protocol])
        auto& s = self->state;
        if (s.deleted_forks.count(m.fork)) return answer{0};  // a late duplicate after the fork's delete
        if (s.deleted) return answer{1};
        s.forks.insert(m.fork);
        return answer{0};
      },
      [self](user_delete& m) {
        auto& s = self->state;
        s.deleted_forks.insert(m.fork);
        s.forks.erase(m.fork);
        if (m.fork == creator_fork(s.id)) s.creator_fork_deleted = true;
        maybe_delete(self);
      },
      [self](child_ack& m) {
        self->state.children.erase(m.token);
        maybe_delete(self);
      },
      [self](local_fetch&) -> caf::result<held_answer> {
        auto& s = self->state;
        if (s.deleted) return deleted_answer(s);
        if (s.ready) return answer_of(s);
        auto rp = self->make_response_promise<held_answer>();
        s.parked_local.push_back(rp);
        return rp;
      },
      [self](lease_request& m) -> caf::result<held_answer> {
        auto& s = self->state;
        if (s.deleted) return deleted_answer(s);
        if (s.ready && s.leased == 0 && s.lease_queue.empty()) {
          if (s.code == 0) s.leased = m.lease;
          return answer_of(s);
        }
        auto rp = self->make_response_promise<held_answer>();
        s.lease_queue.emplace_back(m.lease, rp);
        return rp;
      },
      [self](lease_return& m) {
        auto& s = self->state;
        if (m.lease != s.leased) {  // a lease given up while still queued (the method call timed out)
          for (auto it = s.lease_queue.begin(); it != s.lease_queue.end(); ++it)
            if (it->first == m.lease) {
              it->second.deliver(held_answer{static_cast<std::int32_t>(errc::timeout), "lease given up", {}});
              s.lease_queue.erase(it);
              break;
            }
          return;
        }
        if (m.changed) {
          s.value = std::move(m.value);
          publish(s);  // later fetches from other workers see the new object
        }
        s.leased = 0;
        grant_leases(self);
        maybe_delete(self);
      },
      [self](child_hold& m) {
        auto& s = self->state;
        s.children[m.token] = child_entry{m.child, m.caller};
        if (!m.caller.empty())
          self->delayed_send(self, std::chrono::milliseconds(m.probe_after_ms), probe_due_atom::value, m.token);
      },
      [self](probe_start& m) { probe(self, m.token, m.to); },
      [self](probe_due_atom, std::uint64_t token) {
        auto it = self->state.children.find(token);
        if (it != self->state.children.end()) probe(self, token, it->second.caller);  // no ack: the usual case costs nothing
      },
      [self](local_ref_atom, std::int32_t delta) {
        auto& s = self->state;
        s.local += delta;
        if (delta > 0) s.r->local_ref_arrived(s.id);
        maybe_delete(self);
      },
      [self](control_done& d) {
        on_control_done(self, self->state.ctl, *self->state.r, d);
        maybe_quit(self);
      },
      [self](retry_atom, std::uint64_t seq) { on_retry(self, self->state.ctl, *self->state.r, seq); },
      [self](summary_atom) { return summary(self->state); },
      [self](done_atom) { end(self); },
  };
}

}  // namespace

owner_rref_actor spawn_owner_rref(context_impl& r, const rref_id& id, owner_start start) {
  logger_release release;  // spawned from a node executor or user thread
  return r.sys_->spawn<caf::lazy_init>(owner_rref, r.shared_from_this(), id, std::move(start));
}

}  // namespace troupe::rref_detail
