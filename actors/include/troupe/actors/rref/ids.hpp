#pragma once
/// \file ids.hpp
/// RRef identities and `wire`, the form of an RRef inside a user call or result (Note [RRef
/// protocol] in context.hpp). The ids have a CAF `inspect`: they travel inside the typed control
/// messages of actors/src/rref/protocol.hpp. They also have a Boost `serialize`: an RRef inside a
/// user payload goes through the codec. No field is a float.

#include <compare>
#include <cstdint>
#include <string>
#include <vector>

#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>
#include <caf/meta/type_name.hpp>

namespace troupe {

/// A globally unique RRef id: the worker that created it and a counter local to that worker.
struct rref_id {
  std::string creator;
  std::uint64_t local = 0;
  auto operator<=>(const rref_id&) const = default;
  /// "worker1#7", for messages and leak reports.
  std::string str() const { return creator + "#" + std::to_string(local); }
  template <class Ar> void serialize(Ar& ar, unsigned) { ar & creator & local; }
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rref_id& x) {
  return f(caf::meta::type_name("troupe.rref_id"), x.creator, x.local);
}

/// A globally unique fork id (one per UserRRef), same shape as rref_id.
struct fork_id {
  std::string creator;
  std::uint64_t local = 0;
  auto operator<=>(const fork_id&) const = default;
  bool empty() const { return creator.empty(); }
  std::string str() const { return creator + "/" + std::to_string(local); }
  template <class Ar> void serialize(Ar& ar, unsigned) { ar & creator & local; }
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fork_id& x) {
  return f(caf::meta::type_name("troupe.fork_id"), x.creator, x.local);
}

namespace rref_msg {

/// How an RRef travels inside a user call or result: its id, owner and the fresh fork created
/// for the receiver. It also names the parent (sender), which holds its own reference until the
/// receiver ACKs.
struct wire {
  rref_id id;
  std::string owner;
  fork_id fork;
  std::string parent;
  fork_id parent_fork;            ///< the parent's own fork (empty: the parent is the owner)
  std::uint64_t parent_hold = 0;  ///< the parent's pending-child token
  template <class Ar> void serialize(Ar& ar, unsigned) { ar & id & owner & fork & parent & parent_fork & parent_hold; }
};

}  // namespace rref_msg
}  // namespace troupe
