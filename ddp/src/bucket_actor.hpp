#pragma once
// The bucket actor of Note [DDP reducer]: counts its ready gradients, waits for its turn, launches
// its reduction through the reducer and passes the turn on. Local to one process: its messages
// never cross a process boundary, so they are atoms and integers only.

#include <caf/all.hpp>

#include <cstddef>

namespace troupe::ddp::detail {

class reducer;

using grad_ready_atom = caf::atom_constant<caf::atom("gready")>;
using turn_atom = caf::atom_constant<caf::atom("turn")>;
using reset_atom = caf::atom_constant<caf::atom("reset")>;

/// State of one bucket actor.
struct bucket_state {
  int index = 0;
  std::size_t total = 0;
  std::size_t pending = 0;
  bool turn = false;
  reducer* owner = nullptr;
  caf::actor next;  // the bucket after this one (invalid for the last)
};

/// Spawns the actor of bucket `index` holding `total` gradients; `next` gets the turn after it.
caf::actor spawn_bucket_actor(caf::actor_system& sys, reducer& owner, int index, std::size_t total, caf::actor next);

}  // namespace troupe::ddp::detail
