// The RPC agent: state and behaviour (Note [rpc call] in agent.hpp).
#include "agent.hpp"

#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <tuple>
#include <unordered_map>

#include <caf/all.hpp>

#include "rpc/roster.hpp"
#include "rpc/serve.hpp"
#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/messages.hpp"

namespace troupe::detail {

namespace {

using sweep_atom = caf::atom_constant<caf::atom("sweep")>;
using clock = std::chrono::steady_clock;
constexpr auto sweep_period = std::chrono::milliseconds(5);

struct pending_call {
  std::shared_ptr<rpc::detail::call_state> state;
  caf::actor_addr peer;
  std::string peer_name;
  std::string function;
  std::multimap<std::chrono::steady_clock::time_point, std::uint64_t>::iterator deadline;
};

struct agent_state {
  agent_config cfg;
  std::uint64_t next_id = 1;
  std::unordered_map<std::uint64_t, pending_call> pending;
  std::multimap<clock::time_point, std::uint64_t> deadlines;
  std::map<caf::actor_addr, std::string> peers;  // monitored peer agents -> worker name
  std::optional<roster> identities;  // Note [worker identity]
  bool sweep_scheduled = false;

  ~agent_state() {
    for (auto& [id, p] : pending)
      p.state->complete(errc::invalid_state, "call to '" + p.function + "' on " + p.peer_name + ": node " + cfg.me.name + " shut down", {});
  }
};

using agent_actor = caf::stateful_actor<agent_state>;

void complete(agent_actor* self, std::uint64_t id, errc code, std::string msg, std::vector<char> payload,
              std::vector<char> meta = {}) {
  auto it = self->state.pending.find(id);
  if (it == self->state.pending.end()) return;  // late, duplicate or already failed: ignore
  auto st = std::move(it->second.state);
  self->state.deadlines.erase(it->second.deadline);
  self->state.pending.erase(it);
  st->complete(code, std::move(msg), std::move(payload), std::move(meta));
}

void watch_peer(agent_actor* self, const caf::actor& peer, const std::string& name) {
  if (peer.node() == self->node()) return;  // our own agent: nothing to monitor
  if (self->state.peers.emplace(peer.address(), name).second) self->monitor(peer);
}

void schedule_sweep(agent_actor* self) {
  if (self->state.sweep_scheduled) return;
  self->state.sweep_scheduled = true;
  self->delayed_send(self, sweep_period, sweep_atom::value);
}

void sweep(agent_actor* self) {
  auto& s = self->state;
  s.sweep_scheduled = false;
  const auto now = clock::now();
  while (!s.deadlines.empty() && s.deadlines.begin()->first <= now) {
    const auto id = s.deadlines.begin()->second;
    auto it = s.pending.find(id);
    if (it != s.pending.end())
      complete(self, id, errc::timeout,
               "call to '" + it->second.function + "' on " + it->second.peer_name + " from " + s.cfg.me.name +
                   ": no answer by the deadline",
               {});
    else
      s.deadlines.erase(s.deadlines.begin());
  }
  if (!s.pending.empty()) schedule_sweep(self);
}

template <class Msg>
void deliver(agent_actor* self, const caf::actor& to, Msg msg, const transport_decision& d) {
  for (int i = 0; i < d.copies; ++i) {
    Msg m = i + 1 == d.copies ? std::move(msg) : msg;  // the last copy takes the payload
    if (d.delay.count() > 0) self->delayed_send(to, d.delay, std::move(m));
    else self->send(to, std::move(m));
  }
}

void start_call(agent_actor* self, local_call& c) {
  auto& s = self->state;
  const auto id = s.next_id++;
  if (!c.peer) {
    c.state->complete(errc::peer_lost, "call to '" + c.function + "': worker " + c.peer_name + " is not reachable", {});
    return;
  }
  const auto dl = s.deadlines.emplace(c.state->deadline(), id);
  s.pending.emplace(id, pending_call{c.state, c.peer.address(), c.peer_name, c.function, dl});
  watch_peer(self, c.peer, c.peer_name);
  if (!s.cfg.hook) {  // the pass-through transport: no envelope, no copies
    self->send(c.peer, rpc_request{id, std::move(c.function), s.cfg.me.name, std::move(c.payload), std::move(c.meta)});
  } else {
    envelope env{message_kind::rpc_request, s.cfg.me.name, c.peer_name, id, c.function, std::move(c.payload), std::move(c.meta)};
    const auto d = s.cfg.hook->on_send(env);
    deliver(self, c.peer, rpc_request{id, std::move(env.function), s.cfg.me.name, std::move(env.payload), std::move(env.meta)}, d);
  }
  schedule_sweep(self);
}

bool authorized(agent_actor* self, const char* what) {
  const auto& sender = self->current_sender();
  if (sender && (sender->node() == self->node() || self->state.cfg.auth->contains(sender->node()))) return true;
  std::fprintf(stderr, "[troupe] %s: refused %s from unauthenticated node %s\n", self->state.cfg.me.name.c_str(), what,
               sender ? caf::to_string(sender->node()).c_str() : "<anonymous>");
  return false;
}

void serve_request(agent_actor* self, rpc_request& req) {
  auto& s = self->state;
  auto reply_to = caf::actor_cast<caf::actor>(self->current_sender());
  if (!authorized(self, "an rpc request")) {
    if (reply_to)
      self->send(reply_to, rpc_response{req.id, static_cast<std::uint8_t>(errc::unauthorized),
                                        "worker " + s.cfg.me.name + " refused the call: the caller never presented the job token", {}, {}});
    return;
  }
  transport_decision d;
  if (s.cfg.hook) {
    envelope env{message_kind::rpc_request, req.caller, s.cfg.me.name, req.id, req.function, std::move(req.payload), std::move(req.meta)};
    d = s.cfg.hook->on_receive(env);
    if (d.copies == 0) return;
    req.payload = std::move(env.payload);
    req.meta = std::move(env.meta);
  }
  auto fn = s.cfg.functions->find(req.function);
  if (!fn) {
    self->send(reply_to, rpc_response{req.id, static_cast<std::uint8_t>(errc::unknown_function),
                                      "worker " + s.cfg.me.name + " has no function '" + req.function + "'", {}, {}});
    return;
  }
  auto me = caf::actor_cast<caf::actor>(self);
  // Shared by the jobs (not copied into each, payload and all, on this actor's thread); served
  // once, its large inline tensors may view its payload (Note [adopted payload]).
  auto held = std::make_shared<rpc_request>(std::move(req));
  for (int i = 0; i < d.copies; ++i) {
    auto job = [fn, held, adopt = d.copies == 1, reply_to, me, name = s.cfg.me.name, bulk = s.cfg.bulk, rec = s.cfg.recorder,
                local = same_host(reply_to.node(), self->node()), ic = s.cfg.interceptor ? s.cfg.interceptor->get() : nullptr] {
      serve_adopting(*fn, *held, adopt, name, {local, bulk, reply_to.node(), rec}, ic.get(), [me, reply_to, caller = held->caller](rpc_response r) {
        caf::anon_send(me, outgoing_response{reply_to, caller, std::move(r)});
      });
    };
    if (!s.cfg.exec->post(std::move(job)))
      self->send(reply_to, rpc_response{held->id, static_cast<std::uint8_t>(errc::invalid_state),
                                        "worker " + s.cfg.me.name + " is shutting down", {}, {}});
  }
}

void on_response(agent_actor* self, rpc_response& r) {
  auto& s = self->state;
  auto it = s.pending.find(r.id);
  if (it == s.pending.end()) return;  // late (timed out), duplicated, or never ours
  // Only the peer the call went to may answer it: a response from anyone else is forged.
  const auto& sender = self->current_sender();
  if (!sender || sender->address() != it->second.peer) {
    std::fprintf(stderr, "[troupe] %s: ignored a response to call %llu from an actor other than %s\n", s.cfg.me.name.c_str(),
                 static_cast<unsigned long long>(r.id), it->second.peer_name.c_str());
    return;
  }
  const std::string peer = it->second.peer_name;
  if (s.cfg.hook) {
    envelope env{message_kind::rpc_response, peer, s.cfg.me.name, r.id, {}, std::move(r.payload), std::move(r.meta)};
    if (s.cfg.hook->on_receive(env).copies == 0) return;
    r.payload = std::move(env.payload);
    r.meta = std::move(env.meta);
  }
  complete(self, r.id, static_cast<errc>(r.code), std::move(r.message), std::move(r.payload), std::move(r.meta));
}

// Fails every call pending to the peer behind `addr` with peer_lost and reports the loss.
void lose_peer(agent_actor* self, const caf::actor_addr& addr, const std::string& why) {
  auto& s = self->state;
  auto it = s.peers.find(addr);
  if (it == s.peers.end()) return;
  const std::string name = it->second;
  s.peers.erase(it);
  s.identities->forget(addr);
  std::vector<std::uint64_t> lost;
  for (const auto& [id, p] : s.pending)
    if (p.peer == addr) lost.push_back(id);
  for (auto id : lost) {
    const auto fn = s.pending[id].function;
    complete(self, id, errc::peer_lost, "worker " + name + " was lost (" + why + ") during call to '" + fn + "' from " + s.cfg.me.name, {});
  }
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
  }
  hello_ack ack{s.cfg.me, caf::actor_cast<caf::actor>(self), s.cfg.store, 0, {}, {}, false};
  if (s.cfg.issue_ticket) std::tie(ack.fast_port, ack.fast_secret) = s.cfg.issue_ticket(h.info.name, sender->node());
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
      [=](local_call& c) { start_call(self, c); },
      [=](watch_peer_msg& w) { watch_peer(self, w.peer, w.name); },
      [=](peer_silent_msg& m) { on_peer_silent(self, m); },
      [=](shm_verdict& v) {  // Note [shm reachability]: whether the caller can open ours
        const auto& from = self->current_sender();
        if (from && self->state.cfg.bulk && self->state.cfg.auth->contains(from->node()))
          self->state.cfg.bulk->set_reachable(caf::to_string(from->node()), v.ok);
      },
      [=](rpc_request& r) { serve_request(self, r); },
      [=](rpc_response& r) { on_response(self, r); },
      [=](outgoing_response& o) {
        transport_decision d;
        if (self->state.cfg.hook) {
          envelope env{message_kind::rpc_response, self->state.cfg.me.name, o.peer, o.response.id, {}, std::move(o.response.payload),
                       std::move(o.response.meta)};
          d = self->state.cfg.hook->on_send(env);
          o.response.payload = std::move(env.payload);
          o.response.meta = std::move(env.meta);
        }
        if (o.to) deliver(self, o.to, std::move(o.response), d);
      },
      [=](sweep_atom) { sweep(self); },
  };
}

}  // namespace

caf::actor spawn_agent(caf::actor_system& sys, agent_config cfg) { return sys.spawn(agent, std::move(cfg)); }

}  // namespace troupe::detail
