// The supervisor actor (troupe/actors/supervisor.hpp).
//
// Note [supervisor restart]
// A supervisor is a detached actor. It starts its children in spec order, each through the
// spawn service of the first worker in the child's list that answers, and monitors each.
//
//   supervisor --(spawn, factory, name)--> troupe.spawner@w --factory, publish name--> child
//   supervisor <--------------- id ----------------------------
//   supervisor --monitor--> child ... child dies --down_msg--> supervisor
//
// On a down_msg of a current incarnation it applies the restart type, then the strategy:
// - one_for_one restarts the failed child;
// - one_for_all stops the others in reverse start order, then starts all in order;
// - rest_for_one stops the children after the failed one in reverse, then starts them in order.
// Each restart event is timed. More than max_restarts events within period make it give up.
// Giving up, a failed start, or an exit message stop every running child in reverse start
// order, each waited for by its down_msg (bounded by stop_timeout, then a kill). Then the
// supervisor quits; the reason of a failure names the supervisor, the child and the cause.
// A down_msg of an incarnation the supervisor stopped itself is stale and ignored: stopping
// demonitors first. A lost peer kills its proxies with peer_lost, so a child on a dead worker
// gives a down_msg, and a restart there fails fast and moves to the next worker.
#include "troupe/actors/supervisor.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/system_messages.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/spawn_options.hpp>
#include <caf/stateful_actor.hpp>

#include <deque>
#include <optional>
#include <set>

#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/remote_actor.hpp"
#include "troupe/actors/spawn_service.hpp"
#include "troupe/actors/workers.hpp"

namespace troupe {

namespace {

using start_atom = caf::atom_constant<caf::atom("supstart")>;
using clock = std::chrono::steady_clock;
using kind = supervisor_event::kind_type;

struct child_state {
  child_spec spec;
  caf::actor actor;
  std::string worker;
  std::int64_t incarnation = 0;
  bool running = false;
  bool dropped = false;  // temporary, or transient after a normal exit: never started again
};

struct supervisor_state {
  node* n = nullptr;
  supervisor_options o;
  std::vector<child_state> children;
  std::deque<clock::time_point> restarts;
};

using self_ptr = caf::stateful_actor<supervisor_state>*;

bool is_normal(const caf::error& reason) { return !reason || reason == caf::exit_reason::normal; }

std::string describe(const caf::error& reason) {
  if (is_normal(reason)) return "";
  if (reason.category() == troupe_error_atom::value) {
    auto e = from_caf_error(reason, "");
    return std::string(to_string(e.code())) + ": " + e.message();
  }
  return caf::to_string(reason);
}

void report(self_ptr self, kind k, const child_state& c, std::string cause) {
  if (!self->state.o.on_event) return;
  self->state.o.on_event(supervisor_event{k, c.spec.name, c.worker, c.incarnation, c.actor, std::move(cause)});
}

// Starts child `c` on the first worker that can; the error lists every worker's cause.
std::optional<error> start_child(self_ptr self, child_state& c) {
  auto& st = self->state;
  auto workers = c.spec.workers;
  if (workers.empty()) workers.push_back(st.n->info().name);
  std::string causes;
  errc code = errc::peer_lost;
  for (const auto& w : workers) {
    try {
      auto spawner = lookup_actor(*st.n, w, spawn_service::published_name, st.o.spawn_timeout);
      caf::scoped_actor asker{st.n->system()};
      std::uint64_t id = 0;
      caf::error err;
      asker->request(spawner, st.o.spawn_timeout, spawn_atom::value, c.spec.factory, c.spec.name)
          .receive([&](std::uint64_t x) { id = x; }, [&](caf::error& e) { err = std::move(e); });
      if (err) throw from_caf_error(err, "spawn service of " + w);
      auto child = lookup_actor(*st.n, w, c.spec.name, st.o.spawn_timeout);
      if (!child || child.id() != id) throw error(errc::invalid_state, "worker " + w + " published another actor under the name");
      self->monitor(child);
      c.actor = child;
      c.worker = w;
      c.running = true;
      ++c.incarnation;
      report(self, kind::started, c, "");
      return std::nullopt;
    } catch (const error& e) {
      code = e.code();
      causes += (causes.empty() ? "" : "; ") + w + ": " + std::string(to_string(e.code())) + ": " + e.message();
    } catch (const std::exception& e) {
      code = errc::protocol_violation;
      causes += (causes.empty() ? "" : "; ") + w + ": " + e.what();
    }
  }
  return error(code, "cannot start child '" + c.spec.name + "' (factory '" + c.spec.factory + "'): " + causes);
}

// Stops a running child and waits for its down_msg (stop_timeout, then a kill).
void stop_child(self_ptr self, child_state& c) {
  if (!c.running) return;
  c.running = false;
  if (c.spec.restart == restart_type::temporary) c.dropped = true;
  self->demonitor(c.actor);
  caf::scoped_actor waiter{self->system()};
  waiter->monitor(c.actor);
  waiter->send_exit(c.actor, caf::exit_reason::user_shutdown);
  bool down = false;
  for (int round = 0; round < 2 && !down; ++round) {
    waiter->receive([&](const caf::down_msg& d) { down = d.source == c.actor.address(); },
                    caf::after(self->state.o.stop_timeout) >> [&] { waiter->send_exit(c.actor, caf::exit_reason::kill); });
  }
  report(self, kind::stopped, c, down ? "" : "did not stop within the stop timeout");
}

// Stops the running children with index >= from, in reverse start order.
void stop_from(self_ptr self, std::size_t from) {
  auto& cs = self->state.children;
  for (auto i = cs.size(); i-- > from;) stop_child(self, cs[i]);
}

void give_up(self_ptr self, const error& cause, const std::string& child) {
  stop_from(self, 0);
  auto& st = self->state;
  const std::string msg = "supervisor '" + st.o.name + "' on " + st.n->info().name + " gave up: " + cause.message();
  if (st.o.on_event) st.o.on_event(supervisor_event{kind::gave_up, child, "", 0, nullptr, msg});
  self->quit(to_caf_error(cause.code(), msg));
}

// Starts every child with index >= from that should run, in order; false when it gave up.
bool start_from(self_ptr self, std::size_t from) {
  auto& cs = self->state.children;
  for (auto i = from; i < cs.size(); ++i) {
    if (cs[i].running || cs[i].dropped) continue;
    if (auto err = start_child(self, cs[i])) {
      give_up(self, *err, cs[i].spec.name);
      return false;
    }
  }
  return true;
}

// Records a restart; false when it exceeds the intensity.
bool within_intensity(supervisor_state& st) {
  const auto now = clock::now();
  st.restarts.push_back(now);
  while (!st.restarts.empty() && now - st.restarts.front() > st.o.period) st.restarts.pop_front();
  return static_cast<std::int32_t>(st.restarts.size()) <= st.o.max_restarts;
}

void on_down(self_ptr self, const caf::down_msg& d) {
  auto& st = self->state;
  std::size_t k = 0;
  while (k < st.children.size() && !(st.children[k].running && st.children[k].actor.address() == d.source)) ++k;
  if (k == st.children.size()) return;  // a stale incarnation
  auto& c = st.children[k];
  c.running = false;
  const auto cause = describe(d.reason);
  report(self, kind::exited, c, cause);
  const auto type = c.spec.restart;
  if (type == restart_type::temporary || (type == restart_type::transient && is_normal(d.reason))) {
    c.dropped = true;
    return;
  }
  if (!within_intensity(st)) {
    auto code = is_normal(d.reason) ? errc::invalid_state : from_caf_error(d.reason, "").code();
    give_up(self, error(code, "child '" + c.spec.name + "' on " + c.worker + " exceeded the restart intensity (" + std::to_string(st.o.max_restarts) +
                                  " restarts in " + std::to_string(st.o.period.count()) + " ms); last cause: " + (cause.empty() ? "normal exit" : cause)),
            c.spec.name);
    return;
  }
  switch (st.o.strategy) {
    case restart_strategy::one_for_one: start_from(self, k); break;  // only k is down
    case restart_strategy::one_for_all: stop_from(self, 0); start_from(self, 0); break;
    case restart_strategy::rest_for_one: stop_from(self, k + 1); start_from(self, k); break;
  }
}

caf::behavior supervisor_behavior(self_ptr self, node* n, supervisor_options o) {
  self->state.n = n;
  for (auto& spec : o.children) self->state.children.push_back(child_state{spec, nullptr, "", 0, false, false});
  self->state.o = std::move(o);
  self->set_down_handler([self](caf::down_msg& d) { on_down(self, d); });
  self->set_exit_handler([self](caf::exit_msg& m) {
    stop_from(self, 0);
    self->quit(m.reason);
  });
  self->send(self, start_atom::value);
  return {[self](start_atom) { start_from(self, 0); }};
}

void validate(node& n, const supervisor_options& o) {
  const std::string who = n.info().name + ": supervisor '" + o.name + "'";
  if (o.max_restarts < 0) throw error(errc::bad_argument, who + ": max_restarts must not be negative");
  if (o.period.count() <= 0) throw error(errc::bad_argument, who + ": the restart period must be positive");
  std::set<std::string> names;
  for (const auto& c : o.children) {
    if (c.name.empty()) throw error(errc::bad_argument, who + ": a child has an empty name");
    if (c.factory.empty()) throw error(errc::bad_argument, who + ": child '" + c.name + "' names no factory");
    if (!names.insert(c.name).second) throw error(errc::bad_argument, who + ": duplicate child name '" + c.name + "'");
    for (const auto& w : c.workers) {
      try {
        get_worker_info(n, w);
      } catch (const error& e) {
        throw error(e.code(), who + ": child '" + c.name + "' names worker '" + w + "': " + e.message());
      }
    }
  }
}

}  // namespace

caf::actor spawn_supervisor(node& n, supervisor_options o) {
  validate(n, o);
  return n.system().spawn<caf::detached>(supervisor_behavior, &n, std::move(o));
}

}  // namespace troupe
