// publish_actor and lookup_actor (troupe/actors/remote_actor.hpp).
#include "troupe/actors/remote_actor.hpp"

#include <caf/actor_registry.hpp>

#include "remote/remote_actors.hpp"

namespace troupe::detail {

namespace {

std::string key_of(const std::string& worker, const std::string& name) { return "troupe/actor/" + worker + "/" + name; }

std::string describe(const std::set<std::string>& iface) {
  if (iface.empty()) return "{} (untyped)";
  std::string out = "{";
  for (const auto& s : iface) out += (out.size() > 1 ? ", " : "") + s;
  return out + "}";
}

}  // namespace

void publish_actor(node& n, caf::strong_actor_ptr actor, const std::string& name, const std::set<std::string>& interface) {
  const auto& me = n.info().name;
  if (!actor) throw error(errc::bad_argument, me + ": cannot publish a null actor as '" + name + "'");
  if (actor->node() != n.system().node())
    throw error(errc::bad_argument, me + ": cannot publish '" + name + "': the actor lives in another process");
  n.system().registry().put(actor->id(), actor);  // found by id by the messages that reach it
  std::string value = std::to_string(actor->id());
  for (const auto& s : interface) value += "\n" + s;
  n.store().set(key_of(me, name), value);
}

caf::strong_actor_ptr lookup_actor(node& n, const std::string& worker, const std::string& name, const std::set<std::string>& want,
                                   std::chrono::milliseconds timeout) {
  const std::string what = n.info().name + ": lookup of actor '" + name + "' on worker " + worker;
  std::string value;
  try {
    value = n.store().get(key_of(worker, name), timeout);
  } catch (const error& e) {
    if (e.code() != errc::timeout) throw error(e.code(), what + ": " + e.message());
    throw error(errc::timeout, what + ": nothing was published under that name within " + std::to_string(timeout.count()) + " ms");
  }
  std::set<std::string> published;
  const auto nl = value.find('\n');
  const caf::actor_id id = std::stoull(value.substr(0, nl));
  for (auto at = nl; at != std::string::npos;) {
    const auto next = value.find('\n', at + 1);
    published.insert(value.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1));
    at = next;
  }
  if (!want.empty() && !n.system().assignable(published, want))
    throw error(errc::bad_argument, what + ": it is published with interface " + describe(published) + ", which does not offer the requested " + describe(want));
  caf::strong_actor_ptr p;
  try {
    p = n.remote_actors().proxy_for(worker, id, timeout);
  } catch (const error& e) {
    throw error(e.code(), what + ": " + e.message());
  }
  if (!p) throw error(errc::invalid_state, what + ": the actor has exited");
  return p;
}

}  // namespace troupe::detail
