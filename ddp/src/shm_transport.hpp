#pragma once
// The shared-memory transport of the CPU process group: one segment per rank, mapped by every
// rank, with monotonically increasing counters that pace a chunked pipeline.
//
// Note [shm collectives]
// ----------------------
//   Segment of rank r:  | control (64 KiB) | slot 0 | slot 1 | p2p mailbox per destination |
// The control part holds r's pid, an abort flag + reason, two fingerprint slots, and counters.
// Only r writes the counters and everyone reads them. Each is on its own cache line; each is a
// futex word:
//   fp_seq   collectives r has entered            in_cnt  chunks r has staged into its slot
//   red_cnt  chunks whose shard r has reduced     out_cnt chunks r has finished consuming
// A collective #s first writes its fingerprint (kind, op, dtype, numel, root) into fp[s % 2].
// Then it sets fp_seq = s and waits until every rank's fp_seq >= s. Then it compares all
// fingerprints. Every rank sees the same set, so every rank raises the same collective_mismatch;
// nobody waits for a partner that took another path. A rank cannot overwrite fp[s % 2]
// (collective s+2) before every rank has passed collective s+1's entry, which it reaches only
// after reading s's fingerprints.
// Data moves in chunks; chunk g (counted over the group's life, identical on every rank since the
// sizes were checked) uses slot g % 2:
//
//   rank r:  wait all out_cnt >= g-1 (slot free) -> stage the bytes peers need -> in_cnt = g+1
//            wait all in_cnt >= g+1 -> reduce shard r from every slot -> red_cnt = g+1
//            wait all red_cnt >= g+1 -> copy the other shards out -> out_cnt = g+1
//
// Every shard is reduced by exactly one rank in rank order, so every rank ends with the same
// bits. Waiting: spin briefly, then FUTEX_WAIT (1 ms slices) on the peer's counter. Every few
// ms the waiter checks that peer's pidfd, its abort flag, and the deadline. The pidfd is
// readable once the process died, zombie or not. Only the awaited peer is checked: a rank that
// finished its part and exited (its segment stays mapped here) is no failure.
//   - a dead peer -> peer_lost naming it;
//   - a peer that aborted -> peer_lost with its reason;
//   - the deadline -> timeout naming the ranks not yet there.
// Any of these marks this rank aborted too (the group is broken: later collectives fail at once).
// A rank that destroys its group sets `left`. A peer still waiting for it, having issued more
// collectives than the leaver, fails with collective_mismatch. The error names the leaver, the
// last collective it entered and the one this rank waits in. So a rank that skipped a collective
// ends the others' wait with a mismatch, not a timeout. Before throwing, the waiter re-reads
// the counter: a peer that published its last value and then left or died is no failure.
// Assumes: one host, the same binary layout on every rank, collectives issued in the same order.
//
// Note [shm zero copy]
// --------------------
// Each rank also maps every rank's arena: a sparse segment (opts.shared_arena_bytes, pages
// reserved only when process_group::empty_shared hands out a range) from which tensors are
// carved. A collective's entry publishes, beside its fingerprint, where this rank's tensor lies
// in its arena (data_off, 0 = elsewhere). When every rank's tensor lies in its arena (all ranks
// read the same data_off values, so all decide alike), allreduce works in place, with no slot:
//
//   rank r:  for each piece j of shard r: fold shard r of every rank's tensor (rank order)
//                                         into r's own tensor -> red_cnt = g_j + 1
//            for each piece j, peer k:    wait red_cnt(k) >= g_j + 1, copy piece j of shard k
//                                         from k's tensor into r's        -> out_cnt = g_j + 1
//            wait every out_cnt >= g_last + 1 (no peer still reads r's tensor), return
//
// Rank r writes only shard r of its own tensor before peers finished folding shard k, which
// reads shard k only. It overwrites shard k only after k published it folded. So no byte is
// read while it is written. The chunk counters advance exactly as in the slot protocol, with
// g = the group's chunk number, same on every rank. So both kinds mix freely. Per rank and byte
// of tensor this moves (2w-1)/w reads and (2w-2)/w + 1/w writes, against about twice that
// through the slots.
// Ordinary tensors take the slot path (one copy in, one out).

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "lane_operation.hpp"
#include "shm_arena.hpp"
#include "troupe/actors/shared_memory.hpp"
#include "troupe/ddp/process_group.hpp"

#include <functional>
#include <memory>
#include <mutex>

namespace troupe {
class peer_events;
}

namespace troupe::ddp::detail {

/// The three store operations the rendezvous needs (store_client or file_store), and the
/// node's peer-loss events when the store belongs to a node (Note [group peer loss]).
struct rendezvous {
  std::function<void(const std::string&, const std::string&)> set;
  std::function<std::string(const std::string&, std::chrono::milliseconds)> get;
  std::function<void(const std::string&, int, int, std::chrono::milliseconds)> barrier;
  std::shared_ptr<peer_events> events;
};

inline constexpr int max_ranks = 64;
inline constexpr std::size_t control_bytes = std::size_t{64} << 10;

enum counter : int { fp_seq = 0, in_cnt = 1, red_cnt = 2, out_cnt = 3, num_counters = 4 };

/// What a collective is, compared across ranks before any byte moves.
struct fingerprint {
  std::uint32_t seq = 0;
  std::uint8_t kind = 0;  // collective_kind
  std::uint8_t op = 0;
  std::uint8_t dtype = 0;
  std::uint8_t pad = 0;
  std::int32_t root = -1;
  std::int64_t numel = 0;
};

enum class collective_kind : std::uint8_t {
  allreduce = 1, broadcast, allgather, reduce_scatter, barrier, reduce, gather, scatter, all_to_all
};
const char* to_string(collective_kind k) noexcept;
std::string describe(const fingerprint& f);

/// The fingerprint of collective #seq (kind, op, and the dtype/numel of `t` when given); both
/// transports compare these across ranks before moving data.
inline fingerprint make_fp(std::uint32_t seq, collective_kind k, reduce_op op, const tensor* t, int root) {
  fingerprint f;
  f.seq = seq;
  f.kind = static_cast<std::uint8_t>(k);
  f.op = static_cast<std::uint8_t>(op);
  f.root = root;
  if (t != nullptr) {
    f.dtype = static_cast<std::uint8_t>(t->dtype());
    f.numel = t->numel();
  }
  return f;
}

struct alignas(64) padded_counter {
  std::atomic<std::uint32_t> v{0};
};

/// The control block at the start of each rank's segment.
struct control_block {
  padded_counter counters[num_counters];
  padded_counter p2p_sent[max_ranks];  // bytes chunks sent to each destination
  padded_counter p2p_ack[max_ranks];   // chunks consumed from each source
  fingerprint p2p_meta[max_ranks];     // per destination: dtype, numel, tag (in root) of the send
  fingerprint fp[2];
  std::uint64_t data_off[2] = {};  // per fp slot: 1 + arena offset of the collective's tensor, 0 if none
  std::atomic<std::uint32_t> aborted{0};
  std::atomic<std::uint32_t> left{0};  // set when r destroyed its group (a clean leave)
  std::int32_t pid = 0;
  char reason[512] = {};
};
static_assert(sizeof(control_block) <= control_bytes);

/// One rank's view of every rank's segment. Used by the group's worker threads: collectives on
/// one, sends on another, receives on a third (they touch disjoint counters).
class shm_transport {
 public:
  shm_transport(const rendezvous& store, int rank, int world, const std::string& name, const process_group_options& opts);
  ~shm_transport();
  shm_transport(const shm_transport&) = delete;
  shm_transport& operator=(const shm_transport&) = delete;

  int rank() const noexcept { return rank_; }
  int world() const noexcept { return world_; }
  std::size_t slot_bytes() const noexcept { return slot_bytes_; }
  std::size_t p2p_bytes() const noexcept { return p2p_bytes_; }
  control_block& ctl(int r) const noexcept { return *static_cast<control_block*>(segments_[r].data()); }
  std::byte* slot(int r, std::uint32_t chunk) const noexcept;
  std::byte* mailbox(int owner, int dst) const noexcept;

  /// Sets the deadline of the operation that starts now on lane `l` and names it for messages.
  void begin(lane l, std::string what);
  /// Stores `value` into this rank's counter and wakes its waiters.
  void publish(std::atomic<std::uint32_t>& c, std::uint32_t value);
  void publish(counter c, std::uint32_t value) { publish(ctl(rank_).counters[c].v, value); }
  /// Blocks until peer `r`'s counter reaches `target` (wrap-safe), bounded by the deadline of
  /// the operation on lane `l`. Throws as in the note.
  void wait_ge(int r, std::atomic<std::uint32_t>& c, std::uint32_t target, lane l = lane::collectives);
  /// wait_ge on counter `c` of every rank.
  void wait_all(counter c, std::uint32_t target);
  /// The fingerprint exchange of Note [shm collectives]; throws collective_mismatch. `data_off`:
  /// 1 + the arena offset of this rank's tensor (Note [shm zero copy]), 0 when not in the arena.
  void enter(fingerprint f, std::uint64_t data_off = 0);
  /// After enter(): where rank `r`'s tensor of collective `seq` lies (in this process's mapping
  /// of r's arena), or nullptr when it is not in r's arena.
  std::byte* peer_data(int r, std::uint32_t seq) const noexcept;
  /// This rank's arena (null when opts.shared_arena_bytes is 0).
  const std::shared_ptr<shm_arena>& arena() const noexcept { return arena_; }
  /// Barrier entry that, past `timeout`, throws errc::timeout naming the ranks missing.
  void enter_monitored(fingerprint f, std::chrono::milliseconds timeout);
  /// Marks this rank aborted with `reason` (peers waiting on it fail with peer_lost at once).
  void abort(const std::string& reason) noexcept;
  /// The node declared a member lost (Note [group peer loss]): every wait of this rank fails
  /// with peer_lost and `reason` within one check period (5 ms). Never blocks.
  void peer_lost(const std::string& reason) noexcept;
  /// Note [collective payload faults], repeat: publishes this rank's entry counter (fp_seq) again
  /// with the value it holds; peers wait for higher values, so they ignore it.
  void repeat_entry() { publish(fp_seq, ctl(rank_).counters[fp_seq].v.load(std::memory_order_relaxed)); }
  /// The same for the last send to `dst` (its p2p_sent counter); `p`, `n` are unused here.
  void repeat_send(int dst, const std::byte* /*p*/, std::size_t /*n*/) {
    auto& c = ctl(rank_).p2p_sent[dst].v;
    publish(c, c.load(std::memory_order_relaxed));
  }
  /// Nothing to do: abort() marks this rank aborted, which ends the receiver's wait.
  void p2p_abort(int /*dst*/, const std::string& /*reason*/) noexcept {}
  /// Repeats dropped on arrival since the last call: always 0 (counters need no dropping).
  std::uint64_t take_repeats() noexcept { return 0; }
  /// The next chunk number; the caller advances it by the chunks it used.
  std::uint32_t& chunk_counter() noexcept { return chunk_; }
  std::uint32_t next_seq() noexcept { return ++seq_; }

 private:
  /// Throws when peer `r` can no longer advance: it left (collective_mismatch: the ranks
  /// issued different numbers of collectives), aborted or died (peer_lost).
  void check_peer(int r, const lane_operation& op);
  /// Reads every rank's rendezvous entry and maps its segment and arena.
  void map_peers(const rendezvous& store, const std::string& prefix, std::size_t total);
  [[noreturn]] void fail_timeout(const std::vector<int>& missing, const lane_operation& op);

  int rank_;
  int world_;
  std::string name_;
  std::size_t slot_bytes_;
  std::size_t p2p_bytes_;
  std::chrono::milliseconds timeout_;
  std::vector<shm_segment> segments_;
  std::shared_ptr<shm_arena> arena_;        // this rank's (shared with the tensors it handed out)
  std::vector<sparse_mapping> peer_arenas_;  // every other rank's, mapped here
  std::vector<std::byte*> arena_bases_;
  std::vector<int> pidfds_;
  std::vector<pid_t> pids_;
  // Per worker thread (collectives, sends and receives run on different threads).
  lane_operation ops_[lane_count];  // one per lane (its own thread only)
  std::uint32_t chunk_ = 0;
  std::uint32_t seq_ = 0;
  std::atomic<bool> lost_{false};
  std::mutex lost_mu_;
  std::string lost_reason_;  // under lost_mu_
};

}  // namespace troupe::ddp::detail
