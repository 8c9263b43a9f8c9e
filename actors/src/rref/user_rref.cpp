// The user_rref actor (Note [user_rref actor] in user_rref.hpp).
#include "user_rref.hpp"

#include <tuple>

#include <caf/all.hpp>

#include "context_impl.hpp"
#include "troupe/actors/rpc/codec.hpp"

namespace troupe::rref_detail {

namespace {

using namespace rref_msg;

struct child_entry {
  fork_id child;
  std::string caller;
};

struct user_state {
  std::shared_ptr<context_impl> r;  // keeps the router alive while the actor runs (it may outlive rref_context)
  rref_id id;
  fork_id fork;
  std::string owner;
  bool confirmed = false, deleting = false;
  std::int32_t failed = 0;
  std::string failure;
  int handles = 1;
  std::map<std::uint64_t, child_entry> children;                       // G2: holds until child_ack
  std::vector<std::tuple<std::string, fork_id, std::uint64_t>> acks;  // parents to ack once confirmed
  control_retries ctl;
  bool quitting = false;
};
using user_self = user_rref_actor::stateful_pointer<user_state>;

void maybe_quit(user_self self) { request_end(self, self->state.deleting && self->state.ctl.sends.empty()); }

// Once confirmed: ack every parent; with no hold left, delete (G1) and end.
void settle(user_self self) {
  auto& s = self->state;
  if (!s.confirmed) return;
  for (const auto& [parent, parent_fork, token] : s.acks) s.r->send_ack(parent, child_ack{s.id, parent_fork, token});
  s.acks.clear();
  if (s.handles > 0 || !s.children.empty() || s.deleting) return;
  s.deleting = true;
  s.r->user_gone({s.id, s.fork});
  if (s.failed == 0) s.r->send_delete(s.owner, user_delete{s.id, s.fork});  // batched and retried by the courier
  maybe_quit(self);
}

void confirm(user_self self, errc code, std::string why) {
  auto& s = self->state;
  if (s.confirmed) return;
  s.confirmed = true;
  s.failed = static_cast<std::int32_t>(code);
  s.failure = std::move(why);
  settle(self);
}

void send_fork_request(user_self self) {
  auto& s = self->state;
  ++s.r->stats_.fork_requests;
  start_control(self, s.ctl, *s.r, s.owner, fork_request{s.id, s.fork},
                [self](errc c, std::int32_t reply) {
                  auto& s = self->state;
                  if (c == errc::ok && reply == 0) return confirm(self, errc::ok, {});
                  if (c == errc::ok) return confirm(self, errc::invalid_state, "rref " + s.id.str() + " was deleted by its owner " + s.owner);
                  if (c == errc::peer_lost) return confirm(self, errc::owner_lost, "owner " + s.owner + " of rref " + s.id.str() + " is lost");
                  confirm(self, c, "fork_request of rref " + s.id.str() + " to " + s.owner + " failed: " + std::string(to_string(c)));
                });
}

// A child whose carrier may be lost: ask its node; drop the hold if it never got it.
void probe(user_self self, std::uint64_t token, const std::string& to) {
  auto& s = self->state;
  auto it = s.children.find(token);
  if (it == s.children.end()) return;
  start_control(self, s.ctl, *s.r, to, fork_probe{s.id, it->second.child},
                [self, token](errc c, std::int32_t reply) {
                  const bool received = c == errc::ok && reply == 1;
                  if (!received && (c == errc::ok || c == errc::peer_lost)) self->state.children.erase(token);
                  settle(self);
                  maybe_quit(self);
                });
}

hold_answer status_of(const user_state& s) { return hold_answer{s.failed, s.failure, s.confirmed}; }

std::string summary(const user_state& s) {
  return "user " + s.id.str() + " fork " + s.fork.str() + " (owner " + s.owner + ", holds " +
         std::to_string(s.handles + static_cast<int>(s.children.size())) +
         (s.deleting ? ", deleting)" : s.confirmed ? ", confirmed)" : ", unconfirmed)");
}

user_rref_actor::behavior_type user_rref(user_self self, std::shared_ptr<context_impl> r, rref_id id, fork_id fork, user_origin origin) {
  auto& st = self->state;
  st.r = std::move(r);
  st.id = std::move(id);
  st.fork = std::move(fork);
  st.owner = origin.owner;
  if (!origin.creator) {
    st.acks.emplace_back(origin.parent, origin.parent_fork, origin.token);
    send_fork_request(self);
  }
  return {
      [self](remote_done& d) {
        const auto code = static_cast<errc>(d.code);
        auto& s = self->state;
        if (d.release) --s.handles;  // settled below (confirm) or once confirmed
        if (code == errc::ok) confirm(self, d.accepted ? errc::ok : errc::invalid_state, "rref " + s.id.str() + " was deleted by its owner " + s.owner);
        else if (code == errc::peer_lost) confirm(self, errc::owner_lost, "owner " + s.owner + " of rref " + s.id.str() + " is lost");
        else send_fork_request(self);  // the call or its reply may be lost: confirm by a retried fork_request
      },
      [self](carrier& c) -> hold_answer {
        auto& s = self->state;
        if (s.deleting)
          return hold_answer{static_cast<std::int32_t>(errc::invalid_state),
                             "rref " + s.id.str() + " fork " + s.fork.str() + ": a stale duplicate of a fork already released", false};
        ++s.handles;
        s.acks.emplace_back(c.parent, c.parent_fork, c.token);
        settle(self);  // already confirmed: ack this parent too
        return status_of(s);
      },
      [self](child_hold& m) -> hold_answer {
        auto& s = self->state;
        if (s.failed != 0 || s.deleting) return status_of(s);
        s.children[m.token] = child_entry{m.child, m.caller};
        if (!m.caller.empty())
          self->delayed_send(self, std::chrono::milliseconds(m.probe_after_ms), probe_due_atom::value, m.token);
        return status_of(s);
      },
      [self](release_atom) {
        --self->state.handles;
        settle(self);
      },
      [self](child_ack& m) {
        self->state.children.erase(m.token);
        settle(self);
      },
      [self](probe_start& m) { probe(self, m.token, m.to); },
      [self](probe_due_atom, std::uint64_t token) {
        auto it = self->state.children.find(token);
        if (it != self->state.children.end()) probe(self, token, it->second.caller);
      },
      [self](status_atom) { return status_of(self->state); },
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

user_rref_actor spawn_user_rref(context_impl& r, const rref_id& id, const fork_id& fork, user_origin origin) {
  logger_release release;  // spawned from a node executor or user thread
  // A creator fork starts idle (its first message is remote_done or a release): lazily, so the
  // spawn wakes no scheduler thread. A bound fork sends its fork_request as it starts.
  if (origin.creator) return r.sys_->spawn<caf::lazy_init>(user_rref, r.shared_from_this(), id, fork, std::move(origin));
  return r.sys_->spawn(user_rref, r.shared_from_this(), id, fork, std::move(origin));
}

}  // namespace troupe::rref_detail
