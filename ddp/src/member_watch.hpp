#pragma once
// A group's use of its node's peer-loss detection: who the members are, and what to do when one
// of them is lost.
//
// Note [group peer loss]
// A group built on a node's store (every shm, tcp and NCCL group, and new_group subgroups) uses
// the node's peer-loss detection (Note [peer loss events]). At construction each rank publishes
// its worker name and learns every member's. It subscribes to the node's losses and watches
// every member. Watching connects to the member, so its node monitors it even when it never
// calls it.
//   member frozen/dead --> node declares it lost (about connection_timeout) --> on_lost(rank, loss)
//     shm/tcp: transport.peer_lost(why) --> every wait fails with peer_lost naming rank and worker
//     nccl:    the watchdog aborts the communicator --> every work fails with peer_lost
//     hierarchical: every part breaks, naming the member's host and that host's ranks
//     --> the group is broken: later collectives fail at once; the others abort alike.
// A stall shorter than connection_timeout is no loss, so nothing fails. A member resumed after
// its loss finds the group failed too (its peers aborted); it is never re-admitted into the
// group: make a new group. A group on a file_store has no node and no such events.

#include <chrono>
#include <functional>
#include <string>

#include "shm_transport.hpp"  // detail::rendezvous
#include "troupe/actors/peer_events.hpp"

namespace troupe::ddp::detail {

/// Watches the members of one group while alive (see the note). Not copyable or movable: the
/// listener refers to it. Destroy it before anything `on_lost` touches.
class member_watch {
 public:
  /// `member` is the lost member's rank in the group. Called on the node's agent thread, at
  /// most once per lost member; it must not block.
  using on_lost = std::function<void(int member, const peer_loss& loss)>;

  /// "rank 2 (worker2) was lost: <reason>".
  static std::string describe(int member, const peer_loss& loss);

  /// Publishes this rank's worker under `key_prefix` + rank, reads every member's (each within
  /// `timeout`), subscribes to `store.events` and watches the members. Requires store.events.
  /// Throws what the store throws (timeout naming the key of a member that never published).
  member_watch(const rendezvous& store, const std::string& key_prefix, int rank, int world, std::chrono::milliseconds timeout,
               on_lost fn);
  member_watch(const member_watch&) = delete;
  member_watch& operator=(const member_watch&) = delete;

 private:
  peer_events::subscription sub_;
};

}  // namespace troupe::ddp::detail
