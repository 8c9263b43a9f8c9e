#pragma once
/// \file ids.hpp
/// RRef identities and the protocol's control messages (Note [RRef protocol] in context.hpp).
/// Every message is a typed struct with a Boost `serialize`, carried as the single argument of a
/// reserved RPC function ("troupe.rref.<message>"), so it passes the transport hook and the
/// fault plan under its own key. No message holds a float.

#include <compare>
#include <cstdint>
#include <string>
#include <vector>

#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>

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

/// A globally unique fork id (one per UserRRef), same shape as rref_id.
struct fork_id {
  std::string creator;
  std::uint64_t local = 0;
  auto operator<=>(const fork_id&) const = default;
  bool empty() const { return creator.empty(); }
  std::string str() const { return creator + "/" + std::to_string(local); }
  template <class Ar> void serialize(Ar& ar, unsigned) { ar & creator & local; }
};

namespace rref_msg {

/// How an RRef travels inside a user call or result: its id, owner, the fresh fork created for
/// the receiver, and the parent (sender) that holds its own reference until the receiver ACKs.
struct wire {
  rref_id id;
  std::string owner;
  fork_id fork;
  std::string parent;
  std::uint64_t parent_hold = 0;  ///< the parent's pending-child token
  template <class Ar> void serialize(Ar& ar, unsigned) { ar & id & owner & fork & parent & parent_hold; }
};

/// caller -> owner: run `function` and keep its result as the value of `id`, known to `fork`.
/// A user call: never retried; deduplicated by id on the owner.
struct remote_call {
  rref_id id;
  fork_id fork;
  std::string function;
  std::vector<char> args;
  template <class Ar> void serialize(Ar& ar, unsigned) { ar & id & fork & function & args; }
};

/// child -> owner: record `fork` as a known fork of `id`. Retried; its reply is the owner accept.
struct fork_request {
  rref_id id;
  fork_id fork;
  template <class Ar> void serialize(Ar& ar, unsigned) { ar & id & fork; }
};

/// child -> parent: the owner accepted the child; the parent may drop the hold `token`. Retried.
struct child_ack {
  rref_id id;
  std::uint64_t token = 0;
  template <class Ar> void serialize(Ar& ar, unsigned) { ar & id & token; }
};

/// user -> owner: the UserRRef `fork` of `id` is gone. Retried; idempotent.
struct user_delete {
  rref_id id;
  fork_id fork;
  template <class Ar> void serialize(Ar& ar, unsigned) { ar & id & fork; }
};

/// parent -> child node, after a call that carried the fork `fork` failed: "did you receive it?"
/// The child answers 1 (it did: its child_ack will come) or 0 (it did not, and now never will:
/// a late arrival of that fork is refused), and the parent drops its hold. Retried.
struct fork_probe {
  rref_id id;
  fork_id fork;
  template <class Ar> void serialize(Ar& ar, unsigned) { ar & id & fork; }
};

/// user -> owner: the value of `id` (to_here), waiting up to timeout_ms for it to exist.
struct fetch {
  rref_id id;
  std::int64_t timeout_ms = 0;
  template <class Ar> void serialize(Ar& ar, unsigned) { ar & id & timeout_ms; }
};

}  // namespace rref_msg
}  // namespace troupe
