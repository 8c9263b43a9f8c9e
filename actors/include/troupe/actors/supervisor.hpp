#pragma once
/// \file supervisor.hpp
/// Supervisors as actors, after Erlang/OTP. A supervisor starts its children from child specs
/// and monitors them. It restarts them by its strategy, and gives up when they fail too often.
///
///   troupe::spawn_service spawner(n, {{"counter", make_counter}});   // on every hosting node
///   troupe::supervisor_options o;
///   o.strategy = troupe::restart_strategy::one_for_all;
///   o.children = {{"a", "counter", {"worker1", "worker2"}}, {"b", "counter", {"worker0"}}};
///   caf::actor sup = troupe::spawn_supervisor(n, o);
///
/// See Note [supervisor restart] in src/supervisor.cpp and docs/supervision.md.

#include <caf/actor.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace troupe {

class node;

/// Which children a supervisor restarts when one fails.
enum class restart_strategy {
  one_for_one,  ///< only the failed child
  one_for_all,  ///< every child: the others stop in reverse start order, then all start in order
  rest_for_one  ///< the failed child and those started after it
};

/// When a child that exited is restarted (OTP's restart types).
enum class restart_type {
  permanent,  ///< always
  transient,  ///< only after an abnormal exit (a reason other than normal)
  temporary   ///< never; the child is dropped when it exits
};

/// One child of a supervisor.
struct child_spec {
  /// The child's name: unique in its supervisor; the child is published under it.
  std::string name;
  /// The factory registered under this name in the target node's spawn_service.
  std::string factory;
  /// The workers that may host the child, in order of preference. Each start uses the first
  /// one whose spawn service answers. Empty means the supervisor's own worker.
  std::vector<std::string> workers;
  restart_type restart = restart_type::permanent;
};

/// What happened to a child, reported to supervisor_options::on_event.
struct supervisor_event {
  /// start_failed: a start failed on every worker (cause: why); a retry follows unless it gave up.
  enum class kind_type { started, stopped, exited, gave_up, start_failed };
  kind_type kind = kind_type::started;
  /// The child (empty for gave_up when no child is to blame).
  std::string child;
  /// The worker hosting this incarnation.
  std::string worker;
  /// 1 for the first start of the child, then counts its restarts.
  std::int64_t incarnation = 0;
  /// The incarnation's handle (started, stopped, exited).
  caf::actor actor;
  /// Why a child exited, or why the supervisor gave up (empty for a normal exit).
  std::string cause;
};

/// A supervisor's configuration.
struct supervisor_options {
  /// Names the supervisor in its errors and events.
  std::string name = "supervisor";
  restart_strategy strategy = restart_strategy::one_for_one;
  /// Restart intensity: at most max_restarts restarts within period; one more and it gives up.
  /// A failed start counts as a restart.
  std::int32_t max_restarts = 3;
  std::chrono::milliseconds period{5000};
  /// The wait before retrying a failed start; doubled per consecutive failure of the child, at
  /// most period / (max_restarts + 1).
  std::chrono::milliseconds start_backoff{100};
  /// Bound on finding a worker's spawn service and on one spawn.
  std::chrono::milliseconds spawn_timeout{10000};
  /// Bound on a child's stop; past it the child is killed.
  std::chrono::milliseconds stop_timeout{5000};
  /// Children in start order.
  std::vector<child_spec> children;
  /// Called in the supervisor's thread after each event, in order. Must not block for long or throw.
  std::function<void(const supervisor_event&)> on_event;
};

/// Validates `o` and spawns a supervisor actor on `n`; it starts its children in order. Blocks
/// to read the job's worker list. Throws troupe::error(bad_argument) naming the child for a bad
/// spec: an empty or duplicate child name, an empty factory name, or a max_restarts below 0. So
/// are a period not above 0 and a negative start_backoff. For an unknown worker, bad_argument names
/// the worker and the job's workers.
/// The supervisor runs in its own thread. A start that fails on every worker is retried after
/// start_backoff and counts against the restart intensity. A child that exits before the
/// supervisor looked it up is a crash. The supervisor exits with a troupe error naming the
/// child and its cause. It does so when failed starts or restarts exceed the intensity, or when
/// a child failed max_restarts + 1 starts in a row. Before it exits, it stops its children in
/// reverse start order. Its monitors and its own supervisor see that reason. An exit message
/// (send_exit, not kill) stops its children in reverse order too.
caf::actor spawn_supervisor(node& n, supervisor_options o);

}  // namespace troupe
