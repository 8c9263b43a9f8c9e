#pragma once
// The bucket actor of Note [DDP reducer]: counts its ready gradients, waits for its turn, starts
// its bucket's reduction and passes the turn on.
//
// Note [bucket actor]
// -------------------
// One typed actor per bucket, on the node's actor system (ddp_options::node) or, without a node,
// on a one-thread actor system the reducer owns. It never sees the reducer. It holds what it needs:
// - its bucket_spec, by value: index, parameter indices, the hook's grad_bucket (tensor handles
//   that share the bucket buffer), the handle of the next bucket's actor;
// - a shared_ptr to the reducer's bucket_shared: the group, the CUDA events, the comm hook and
//   the launch_board its launches go to.
//
//   reducer (backward thread)              bucket actor b                 launch_board
//   ready(param, step) ------------------> pending - 1
//   bucket b - 1 ---- turn --------------> turn = true
//                                          pending == 0 && turn:
//                                            wait events, fault point "allreduce" at step,
//                                            hook -> work ----------------> fill(b, work)
//                                            turn -> bucket b + 1
//                                            back to pending = n, turn = (b == 0)
//   reset ---------------------------------> back to pending = n, turn = (b == 0)
//
// Messages are local (they never cross a process), so they are atoms and integers. A step is the
// count of synchronised backward passes before this one; the actor takes it from its last ready.
// Failures of the hook become a failed slot, never an exception out of the actor.
// Lifetime: the group is the user's and outlives the wrapper. The reducer stops its actors and
// waits for their down messages (bounded by ddp_options::timeout) before it rebuilds or dies, so
// no actor uses the group afterwards.

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "grad_events.hpp"
#include "launch_board.hpp"

namespace troupe::ddp::detail {

using grad_ready_atom = caf::atom_constant<caf::atom("gready")>;
using turn_atom = caf::atom_constant<caf::atom("turn")>;
using reset_atom = caf::atom_constant<caf::atom("reset")>;

/// The bucket actor's interface (Note [bucket actor]).
using bucket_actor = caf::typed_actor<caf::reacts_to<grad_ready_atom, std::size_t, std::int64_t>,
                                      caf::reacts_to<turn_atom>, caf::reacts_to<reset_atom>>;

/// What the bucket actors of one reducer share with it.
struct bucket_shared {
  explicit bucket_shared(collective_group& g) : group(g) {}
  /// The user's group: outlives every bucket actor (Note [bucket actor]).
  collective_group& group;
  /// Recorded by the backward thread, waited on by the actors (Note [DDP on CUDA]).
  grad_events events;
  /// Replaced by the reducer only between backward passes.
  comm_hook hook;
  launch_board board;
};

/// What one bucket actor holds by value.
struct bucket_spec {
  int index = 0;
  std::vector<std::size_t> params;  // indices into parameters()
  grad_bucket view;                 // what the comm hook gets
  bucket_actor next;                // the bucket after this one (invalid for the last)
};

/// Spawns the actor of `spec` on `sys`. Never blocks.
bucket_actor spawn_bucket_actor(caf::actor_system& sys, bucket_spec spec, std::shared_ptr<bucket_shared> shared);

}  // namespace troupe::ddp::detail
