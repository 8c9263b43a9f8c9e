// The spawn service actor (troupe/actors/spawn_service.hpp).
#include "troupe/actors/spawn_service.hpp"

#include <caf/actor_registry.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <caf/spawn_options.hpp>

#include <mutex>
#include <vector>

#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/remote_actor.hpp"

namespace troupe {

namespace detail {

// What the service actor and its owner share: the factories (read-only) and the children
// spawned so far, so the owner can stop them.
struct spawn_service_shared {
  node* n = nullptr;
  std::map<std::string, child_factory> factories;
  std::mutex mu;
  std::vector<caf::actor_addr> children;
  std::map<std::string, caf::actor_id> published;  // child name -> id of its newest incarnation
};

}  // namespace detail

namespace {

caf::result<std::uint64_t> spawn_child(detail::spawn_service_shared& s, const std::string& factory, const std::string& name) {
  const std::string where = s.n->info().name;
  auto it = s.factories.find(factory);
  if (it == s.factories.end())
    return to_caf_error(errc::unknown_function, where + ": no child factory '" + factory + "' is registered (child '" + name + "')");
  caf::actor child;
  try {
    child = it->second(*s.n);
    if (!child) return to_caf_error(errc::bad_argument, where + ": factory '" + factory + "' returned a null actor (child '" + name + "')");
    publish_actor(*s.n, child, name);
  } catch (const error& e) {
    return to_caf_error(e.code(), where + ": factory '" + factory + "' for child '" + name + "': " + e.message());
  } catch (const std::exception& e) {
    return to_caf_error(errc::remote_exception, where + ": factory '" + factory + "' for child '" + name + "' threw: " + e.what());
  }
  std::lock_guard<std::mutex> lock(s.mu);
  s.children.push_back(child.address());
  auto& old = s.published[name];
  if (old != 0 && old != child.id()) s.n->system().registry().erase(old);  // the registry holds the old incarnation
  old = child.id();
  return static_cast<std::uint64_t>(child.id());
}

}  // namespace

spawn_service::spawn_service(node& n, std::map<std::string, child_factory> factories) : shared_(std::make_shared<detail::spawn_service_shared>()) {
  for (const auto& [name, fn] : factories)
    if (name.empty() || !fn) throw error(errc::bad_argument, n.info().name + ": a child factory needs a name and a function ('" + name + "')");
  shared_->n = &n;
  shared_->factories = std::move(factories);
  auto shared = shared_;
  // Detached: a factory and the publish block, and must not hold a scheduler thread.
  actor_ = n.system().spawn<caf::detached>([shared](caf::event_based_actor*) -> caf::behavior {
    return {[shared](spawn_atom, const std::string& factory, const std::string& name) { return spawn_child(*shared, factory, name); }};
  });
  publish_actor(n, actor_, published_name);
}

spawn_service::~spawn_service() {
  shared_->n->system().registry().erase(actor_.id());
  caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
  actor_ = nullptr;
  std::lock_guard<std::mutex> lock(shared_->mu);
  for (const auto& a : shared_->children)
    if (auto h = caf::actor_cast<caf::actor>(a)) caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
  auto& reg = shared_->n->system().registry();
  for (const auto& [name, id] : shared_->published) reg.erase(id);
}

}  // namespace troupe
