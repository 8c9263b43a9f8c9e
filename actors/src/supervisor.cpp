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
// A start that fails on every worker is such an event too. The supervisor retries it after a
// backoff: start_backoff, doubled per consecutive failure of the child, at most
// period / (max_restarts + 1). It starts the children after it only once it ran. It gives up
// when the failures exceed the intensity. It also gives up after max_restarts + 1 consecutive
// failed starts of one child, so starts that fail slower than the period still end.
// A child may exit after the spawn service started it but before the supervisor looked it up
// (the lookup finds nothing, or another actor). That is a crash, not a failed start. The
// supervisor reports it started and exited, by a message to itself, so the starts in progress
// finish first. Then it restarts the child by its type and the strategy.
// Giving up or an exit message stop every running child in reverse start order. Each is waited
// for by its down_msg (bounded by stop_timeout, then a kill). Then the supervisor quits; the reason
// of a failure names the supervisor, the child and the cause.
// A down_msg of an incarnation the supervisor stopped itself is stale and ignored: stopping
// demonitors first. A lost peer kills its proxies with peer_lost. So a child on a dead worker
// gives a down_msg, and a restart there fails fast and moves to the next worker.
#include "troupe/actors/supervisor.hpp"

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/system_messages.hpp>
#include <caf/exit_reason.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/spawn_options.hpp>
#include <caf/stateful_actor.hpp>

#include <algorithm>
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
using retry_atom = caf::atom_constant<caf::atom("supretry")>;
using crashed_atom = caf::atom_constant<caf::atom("supcrash")>;
using clock = std::chrono::steady_clock;
using kind = supervisor_event::kind_type;

struct child_state {
  child_spec spec;
  caf::actor actor;
  std::string worker;
  std::int64_t incarnation = 0;
  bool running = false;
  bool dropped = false;  // temporary, or transient after a normal exit: never started again
  std::int32_t failed_starts = 0;  // consecutive failed starts
};

struct supervisor_state {
  node* n = nullptr;
  supervisor_options o;
  std::vector<child_state> children;
  std::deque<clock::time_point> restarts;
  bool retry_pending = false;  // a retry_atom is on its way
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

// The running incarnation of child k that the spawn service of `w` started as actor `id`. It is
// monitored. When it exited before the lookup, it is reported as crashed
// (Note [supervisor restart]).
void adopt_child(self_ptr self, std::size_t k, const std::string& w, std::uint64_t id) {
  auto& st = self->state;
  auto& c = st.children[k];
  caf::actor child;
  std::string lost;
  auto code = errc::invalid_state;
  try {
    child = lookup_actor(*st.n, w, c.spec.name, st.o.spawn_timeout);
    if (!child || child.id() != id) lost = "worker " + w + " publishes another actor under its name";
  } catch (const error& e) {
    code = e.code();
    lost = std::string(to_string(e.code())) + ": " + e.message();
  }
  c.worker = w;
  c.running = true;
  c.failed_starts = 0;
  ++c.incarnation;
  if (lost.empty()) {
    self->monitor(child);
    c.actor = child;
  } else {
    c.actor = nullptr;
  }
  report(self, kind::started, c, "");
  if (!lost.empty())
    self->send(self, crashed_atom::value, static_cast<std::uint64_t>(k), c.incarnation, static_cast<std::int32_t>(code),
               "exited before the supervisor looked it up (" + lost + ")");
}

// Starts child k on the first worker whose spawn service starts it; the error lists every
// worker's cause.
std::optional<error> start_child(self_ptr self, std::size_t k) {
  auto& st = self->state;
  auto& c = st.children[k];
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
      adopt_child(self, k, w, id);
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
  if (!c.actor) {  // exited before the lookup; its crash report is now stale
    report(self, kind::stopped, c, "");
    return;
  }
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

// Records a restart or a failed start; false when it exceeds the intensity.
bool within_intensity(supervisor_state& st) {
  const auto now = clock::now();
  st.restarts.push_back(now);
  while (!st.restarts.empty() && now - st.restarts.front() > st.o.period) st.restarts.pop_front();
  return static_cast<std::int32_t>(st.restarts.size()) <= st.o.max_restarts;
}

// The wait before the next start of `c` after its failed_starts-th consecutive failure.
std::chrono::milliseconds start_backoff(const supervisor_options& o, const child_state& c) {
  const auto cap = o.period / (static_cast<std::int64_t>(o.max_restarts) + 1);
  auto wait = o.start_backoff;
  for (std::int32_t i = 1; i < c.failed_starts && wait < cap; ++i) wait *= 2;
  return std::min(wait, cap);
}

// A failed start of child k: a retry after the backoff, or giving up past the intensity.
void start_failed(self_ptr self, std::size_t k, const error& err) {
  auto& st = self->state;
  auto& c = st.children[k];
  ++c.failed_starts;
  report(self, kind::start_failed, c, err.message());
  if (!within_intensity(st) || c.failed_starts > st.o.max_restarts) {
    give_up(self,
            error(err.code(), err.message() + " (" + std::to_string(c.failed_starts) + " failed starts; restart intensity " +
                                  std::to_string(st.o.max_restarts) + " in " + std::to_string(st.o.period.count()) + " ms)"),
            c.spec.name);
    return;
  }
  if (st.retry_pending) return;
  st.retry_pending = true;
  self->delayed_send(self, start_backoff(st.o, c), retry_atom::value);
}

// Starts every child with index >= from that should run, in order, up to the first failed start.
void start_from(self_ptr self, std::size_t from) {
  auto& cs = self->state.children;
  for (auto i = from; i < cs.size(); ++i) {
    if (cs[i].running || cs[i].dropped) continue;
    if (auto err = start_child(self, i)) {
      start_failed(self, i, *err);
      return;
    }
  }
}

// Child k's incarnation exited (a down_msg, or a crash before its lookup): restart by its type
// and the strategy, or give up past the intensity.
void child_exited(self_ptr self, std::size_t k, bool normal, errc code, const std::string& cause) {
  auto& st = self->state;
  auto& c = st.children[k];
  c.running = false;
  report(self, kind::exited, c, cause);
  const auto type = c.spec.restart;
  if (type == restart_type::temporary || (type == restart_type::transient && normal)) {
    c.dropped = true;
    return;
  }
  if (!within_intensity(st)) {
    give_up(self, error(normal ? errc::invalid_state : code, "child '" + c.spec.name + "' on " + c.worker + " exceeded the restart intensity (" +
                                                                 std::to_string(st.o.max_restarts) + " restarts in " + std::to_string(st.o.period.count()) +
                                                                 " ms); last cause: " + (cause.empty() ? "normal exit" : cause)),
            c.spec.name);
    return;
  }
  switch (st.o.strategy) {
    case restart_strategy::one_for_one: start_from(self, k); break;  // only k is down
    case restart_strategy::one_for_all: stop_from(self, 0); start_from(self, 0); break;
    case restart_strategy::rest_for_one: stop_from(self, k + 1); start_from(self, k); break;
  }
}

void on_down(self_ptr self, const caf::down_msg& d) {
  auto& st = self->state;
  std::size_t k = 0;
  while (k < st.children.size() && !(st.children[k].running && st.children[k].actor && st.children[k].actor.address() == d.source)) ++k;
  if (k == st.children.size()) return;  // a stale incarnation
  const bool normal = is_normal(d.reason);
  child_exited(self, k, normal, normal ? errc::invalid_state : from_caf_error(d.reason, "").code(), describe(d.reason));
}

// A crash before the lookup (adopt_child), unless the incarnation was stopped or replaced since.
void on_crashed(self_ptr self, std::uint64_t k, std::int64_t incarnation, std::int32_t code, const std::string& cause) {
  auto& cs = self->state.children;
  if (k >= cs.size() || !cs[k].running || cs[k].actor || cs[k].incarnation != incarnation) return;
  child_exited(self, k, false, static_cast<errc>(code), cause);
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
  return {[self](start_atom) { start_from(self, 0); },
          [self](retry_atom) {
            self->state.retry_pending = false;
            start_from(self, 0);
          },
          [self](crashed_atom, std::uint64_t k, std::int64_t inc, std::int32_t code, const std::string& cause) {
            on_crashed(self, k, inc, code, cause);
          }};
}

void validate(node& n, const supervisor_options& o) {
  const std::string who = n.info().name + ": supervisor '" + o.name + "'";
  if (o.max_restarts < 0) throw error(errc::bad_argument, who + ": max_restarts must not be negative");
  if (o.period.count() <= 0) throw error(errc::bad_argument, who + ": the restart period must be positive");
  if (o.start_backoff.count() < 0) throw error(errc::bad_argument, who + ": start_backoff must not be negative");
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
