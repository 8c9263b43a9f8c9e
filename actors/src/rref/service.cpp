// The RRef service actor of a node: the peer-facing end of the control messages.
//
// Note [rref service]
//
// Every rref_context spawns one service actor on the node's actor system. It publishes it under
// the reserved name "troupe.rref" (publish_actor; store key troupe/actor/<worker>/troupe.rref).
// The owner_rref, user_rref and courier actors of other nodes send it their control messages.
// They are remote actor requests (Note [remote actors]); each is answered with an `answer`:
//
//   fork_request      -> delegated to the owner actor (created PENDING if absent), which answers
//                        the accept itself; 1 (refused) when the RRef is gone
//   child_ack         -> the parent actor (owner or fork) gets it; 0
//   user_delete_batch -> each owner actor gets its delete (created if absent: a delete may
//                        overtake its remote_call); 0 at once, the deletes are idempotent
//   fork_probe        -> 1 when this node has (or had) the fork, else 0 and the fork is refused
//                        if it arrives later
//
// A sender looks a peer's service up once (Note [first contact]) and keeps the handle
// (peer_services); this actor monitors every handle kept. Its down_msg drops the handle. When
// the reason is peer_lost (the peer's process or connection is gone), the peer is marked lost.
// So later control messages to it fail at once. The requests in flight to a lost peer fail at
// once too: its proxy answers them with peer_lost when it is killed. A request that gets no
// answer within rref_options::control_attempt_timeout is resent with backoff (control_retries).
#include <caf/all.hpp>

#include "context_impl.hpp"
#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/remote_actor.hpp"

namespace troupe::rref_detail {

namespace {

using rref_msg::answer;

struct service_state {
  std::map<caf::actor_addr, std::string> watched;  // peer service handle -> its worker
};
using service_self = caf::stateful_actor<service_state>*;

answer on_fork_probe(context_impl& c, const rref_msg::fork_probe& m) {
  const fork_key k{m.id, m.fork};
  std::lock_guard<std::mutex> lock(c.mutex_);
  if (c.users_.count(k) || c.gone_users_.contains(k) || c.owner_bound_.contains(k)) return answer{1};
  c.abandoned_.add(k, std::chrono::steady_clock::now(), c.opts_.tombstone_ttl);
  return answer{0};
}

void on_down(service_self self, context_impl& c, const caf::down_msg& d) {
  auto it = self->state.watched.find(d.source);
  if (it == self->state.watched.end()) return;
  c.peers_->drop(it->second, d.source);
  if (d.reason && d.reason.category() == troupe_error_atom::value && static_cast<errc>(d.reason.code()) == errc::peer_lost)
    c.mark_lost(it->second);
  self->state.watched.erase(it);
}

// Holds the router weakly: the router owns this actor and ends it in close().
caf::behavior service(service_self self, std::weak_ptr<context_impl> weak) {
  self->set_down_handler([self, weak](caf::down_msg& d) {
    if (auto c = weak.lock()) on_down(self, *c, d);
  });
  auto gone = [] { return caf::make_error(caf::sec::request_receiver_down, "the rref context of this worker is closed"); };
  return {
      [self, weak, gone](rref_msg::fork_request& m) -> caf::result<answer> {
        auto c = weak.lock();
        if (!c) return gone();
        auto owner = c->owner_for(m.id, true);
        if (!owner) return answer{1};  // refused: the RRef is gone (never for a live fork)
        self->delegate(caf::actor_cast<caf::actor>(*owner), std::move(m));
        return caf::delegated<answer>{};
      },
      [weak, gone](rref_msg::child_ack& m) -> caf::result<answer> {
        auto c = weak.lock();
        if (!c) return gone();
        c->deliver_ack(m);
        return answer{0};
      },
      [weak, gone](rref_msg::user_delete_batch& m) -> caf::result<answer> {
        auto c = weak.lock();
        if (!c) return gone();
        for (auto& d : m.deletes)
          if (auto owner = c->owner_for(d.id, true)) caf::anon_send(*owner, std::move(d));
        return answer{0};
      },
      [weak, gone](rref_msg::fork_probe& m) -> caf::result<answer> {
        auto c = weak.lock();
        if (!c) return gone();
        return on_fork_probe(*c, m);
      },
      [self](watch_peer_atom, const std::string& peer, const caf::actor& h) {
        if (self->state.watched.emplace(h.address(), peer).second) self->monitor(h);
      },
  };
}

}  // namespace

caf::actor spawn_service(context_impl& c) {
  logger_release release;
  return c.sys_->spawn(service, std::weak_ptr<context_impl>(c.shared_from_this()));
}

errc control_failure(const caf::error& e) {
  if (e.category() == troupe_error_atom::value) return static_cast<errc>(e.code());
  if (e == caf::make_error(caf::sec::request_timeout)) return errc::timeout;
  return errc::invalid_state;
}

}  // namespace troupe::rref_detail
