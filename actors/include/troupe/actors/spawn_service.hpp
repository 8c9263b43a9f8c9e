#pragma once
/// \file spawn_service.hpp
/// The spawn service of a node: an actor published as "troupe.spawner". It spawns children
/// from factories registered on that node by name, and publishes each child under its name.
/// Supervisors place children on a worker through it (supervisor.hpp).
///
///   // every process that may host children
///   troupe::spawn_service spawner(n, {{"counter", [](troupe::node& n) { return n.system().spawn(counter); }}});
///
/// Protocol: request (spawn_atom, factory, child name) -> the new actor's id (std::uint64_t).
/// The service runs the factory in its own thread, publishes the actor under the child name
/// (replacing an earlier incarnation) and then replies. Errors: unknown_function naming the
/// factory and the worker; the factory's own troupe::error; bad_argument for a null actor.

#include <caf/actor.hpp>
#include <caf/atom.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>

namespace troupe {

class node;

/// Asks a spawn service to spawn a child.
using spawn_atom = caf::atom_constant<caf::atom("spawn")>;

/// Spawns one child actor on `n` and returns its handle. Runs in the spawn service's thread;
/// it may block briefly and may throw troupe::error.
using child_factory = std::function<caf::actor(node&)>;

namespace detail {
struct spawn_service_shared;
}

/// Owns the spawn service actor of a node. Construct after the node, destroy before it.
/// Destruction stops the service and every child it spawned that is still alive.
class spawn_service {
 public:
  /// The name the service is published under on every node.
  static constexpr const char* published_name = "troupe.spawner";

  /// Spawns the service with `factories` and publishes it. Blocks on one store round trip.
  /// Throws troupe::error: bad_argument (an empty factory name or function), or publish's errors.
  spawn_service(node& n, std::map<std::string, child_factory> factories);
  ~spawn_service();
  spawn_service(const spawn_service&) = delete;
  spawn_service& operator=(const spawn_service&) = delete;

  /// The service actor.
  const caf::actor& handle() const { return actor_; }

 private:
  std::shared_ptr<detail::spawn_service_shared> shared_;
  caf::actor actor_;
};

}  // namespace troupe
