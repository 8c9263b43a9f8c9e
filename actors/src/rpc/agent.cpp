// The node agent: state and behaviour (Note [node agent] in agent.hpp).
#include "agent.hpp"

#include <cstdio>
#include <map>
#include <optional>
#include <tuple>

#include <caf/all.hpp>

#include "rpc/roster.hpp"
#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/messages.hpp"

namespace troupe::detail {

namespace {

struct agent_state {
  agent_config cfg;
  std::map<caf::actor_addr, std::string> peers;  // monitored peer agents -> worker name
  std::optional<roster> identities;  // Note [worker identity]
};

using agent_actor = caf::stateful_actor<agent_state>;

void watch_peer(agent_actor* self, const caf::actor& peer, const std::string& name) {
  if (peer.node() == self->node()) return;  // our own agent: nothing to monitor
  if (self->state.peers.emplace(peer.address(), name).second) self->monitor(peer);
}

// Forgets the peer behind `addr` and reports its loss (the node fails its calls).
void lose_peer(agent_actor* self, const caf::actor_addr& addr, const std::string& why) {
  auto& s = self->state;
  auto it = s.peers.find(addr);
  if (it == s.peers.end()) return;
  const std::string name = it->second;
  s.peers.erase(it);
  s.identities->forget(addr);
  if (s.cfg.on_peer_down) s.cfg.on_peer_down(name, why);
}

void on_peer_down(agent_actor* self, const caf::down_msg& dm) { lose_peer(self, dm.source, caf::to_string(dm.reason)); }

// Note [silent peers]
void on_peer_silent(agent_actor* self, const peer_silent_msg& m) {
  for (const auto& [addr, name] : self->state.peers)
    if (name == m.name) return lose_peer(self, caf::actor_addr(addr), m.reason);
}

caf::result<hello_ack> on_hello(agent_actor* self, hello& h) {
  auto& s = self->state;
  const auto& sender = self->current_sender();
  if (h.token != s.cfg.token || !sender) {
    std::fprintf(stderr, "[troupe] %s: refused hello from '%s' (rank %d): wrong or missing job token\n", s.cfg.me.name.c_str(),
                 h.info.name.c_str(), h.info.rank);
    return to_caf_error(errc::unauthorized, "worker " + s.cfg.me.name + " refused '" + h.info.name + "': wrong or missing job token");
  }
  if (auto why = s.identities->conflict(h.info, sender->node())) {  // Note [worker identity]
    std::fprintf(stderr, "[troupe] %s: refused hello from node %s: %s\n", s.cfg.me.name.c_str(), caf::to_string(sender->node()).c_str(),
                 why->c_str());
    return to_caf_error(errc::unauthorized, "worker " + s.cfg.me.name + " refused the hello: " + *why);
  }
  s.cfg.auth->add(sender->node());
  if (h.agent) {
    s.identities->admit(h.info, sender->node(), h.agent.address());
    watch_peer(self, h.agent, h.info.name);
    if (s.cfg.on_greeted && h.agent.node() != self->node()) s.cfg.on_greeted(h.info.name, h.agent);
  }
  hello_ack ack{s.cfg.me, caf::actor_cast<caf::actor>(self), s.cfg.store, 0, {}, {}, false};
  if (s.cfg.issue_ticket) std::tie(ack.channel_port, ack.channel_secret) = s.cfg.issue_ticket(h.info.name, sender->node());
  // Note [shm reachability]: can we open the caller's memory? (Whether it can open ours, its
  // verdict says, before its first request.)
  if (s.cfg.bulk && same_host(sender->node(), self->node())) {
    ack.shm = s.cfg.bulk->probe();
    ack.shm_ok = ack.shm.pid != 0 && can_open_probe(h.shm);
  }
  return ack;
}

caf::behavior agent(agent_actor* self, agent_config cfg) {
  self->state.cfg = std::move(cfg);
  self->state.identities.emplace(self->state.cfg.me, self->node());
  self->set_down_handler([=](caf::down_msg& dm) { on_peer_down(self, dm); });
  return {
      [=](hello& h) { return on_hello(self, h); },
      [=](watch_peer_msg& w) { watch_peer(self, w.peer, w.name); },
      [=](peer_silent_msg& m) { on_peer_silent(self, m); },
      [=](shm_verdict& v) {  // Note [shm reachability]: whether the caller can open ours
        const auto& from = self->current_sender();
        if (from && self->state.cfg.bulk && self->state.cfg.auth->contains(from->node()))
          self->state.cfg.bulk->set_reachable(caf::to_string(from->node()), v.ok);
      },
  };
}

}  // namespace

caf::actor spawn_agent(caf::actor_system& sys, agent_config cfg) { return sys.spawn(agent, std::move(cfg)); }

}  // namespace troupe::detail
