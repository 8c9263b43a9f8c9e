#pragma once
// The identities a node has seen claimed by live peers (Note [worker identity]). Agent thread
// only.
//
// Note [worker identity]
//
// Every hello carries the sender's worker_info. A node admits a hello only when its claim fits
// the job it knows. The claim needs the same world size and a rank in [0, world_size). Its name
// and rank must be held by no other live node (a node holds its own). The node that said hello
// first keeps its identity while its agent lives. A second process claiming the same rank or
// name is refused with `unauthorized` naming the rank and the name, and logged on stderr.
// Rank 0 sees every joining node first, so an impostor's node constructor throws before it can
// register its address in the store. A claim ends with its agent's down message (the process
// died or was cut off); then a new process may take the identity.

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <caf/actor_addr.hpp>
#include <caf/node_id.hpp>

#include "troupe/actors/worker_info.hpp"

namespace troupe::detail {

class roster {
 public:
  explicit roster(worker_info me, caf::node_id my_node) : me_(std::move(me)) {
    claims_[me_.name] = claim{std::move(my_node), {}, me_.rank};
  }

  /// Why `who` (sent from `node`) cannot join, or nothing when it may.
  std::optional<std::string> conflict(const worker_info& who, const caf::node_id& node) const {
    if (who.world_size != me_.world_size)
      return "rank " + std::to_string(who.rank) + " (" + who.name + ") claims world size " + std::to_string(who.world_size) +
             ", the job has " + std::to_string(me_.world_size);
    if (who.rank < 0 || who.rank >= me_.world_size)
      return "rank " + std::to_string(who.rank) + " (" + who.name + ") is outside the job's world size " + std::to_string(me_.world_size);
    for (const auto& [name, c] : claims_) {
      if (c.node == node || (name != who.name && c.rank != who.rank)) continue;
      return "rank " + std::to_string(who.rank) + " (" + who.name + ") is claimed, but " + name + " (rank " + std::to_string(c.rank) +
             ") is held by a live process";
    }
    return std::nullopt;
  }

  /// Records `who` (whose agent is `agent` on `node`) as live until forget(agent).
  void admit(const worker_info& who, const caf::node_id& node, const caf::actor_addr& agent) {
    claims_[who.name] = claim{node, agent, who.rank};
  }

  /// The agent `agent` went down: its identity is free again.
  void forget(const caf::actor_addr& agent) {
    std::erase_if(claims_, [&](const auto& kv) { return kv.second.agent && kv.second.agent == agent; });
  }

 private:
  struct claim {
    caf::node_id node;
    caf::actor_addr agent;  ///< null for this node's own claim
    std::int32_t rank = 0;
  };
  worker_info me_;
  std::map<std::string, claim> claims_;  // name -> holder
};

}  // namespace troupe::detail
