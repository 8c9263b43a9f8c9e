#pragma once
// Large tensors between processes of one host travel through shared memory, not the CAF
// connection. CAF-0.17-NOTES pitfall 8: one TCP connection per node pair, head-of-line blocking.
//
// Note [tensor over shared memory]
//
// When a node encodes a payload for a peer on the same host (same CAF host id), it builds a
// codec context. That context names its bulk_names, the peer and `shm` (Note [codec context] in
// troupe/actors/rpc/codec_context.hpp). write_tensor then sends every tensor of at least
// `bulk_threshold` bytes as a reference to a shared-memory SEGMENT (tensor kind 1). The
// reference holds the owner's pid, the segment's memfd number in the owner, its name and
// generation. It also holds the tensor's byte offset in it and a one-use ticket.
// Segments are anonymous memfds, never names in /dev/shm. A peer maps one by opening
// /proc/<owner pid>/fd/<fd> (same user). It checks that the file it got is the memfd of that
// name. So a reused pid or fd number fails instead of mapping something else. The kernel frees
// the memory when the last mapping goes. So a SIGKILLed process, sender or receiver, leaks
// nothing.
//
//   * Owner (bulk_names, one per node): a pool per peer node of segments created with
//     memfd_create and mapped once with MAP_POPULATE. A fresh segment per transfer would make
//     the kernel allocate and zero every page on both sides.
//     Payload capacities are powers of two >= 1 MiB after a 4 KiB header page. The header holds
//     an atomic REFERENCE COUNT (0 free, n holders, UINT32_MAX retired) and the generation. The
//     owner takes a free segment only by CAS 0 -> 1, the reference of the message it sends. It
//     then bumps the generation. A segment is never reused while any process holds it.
//   * An ORDINARY tensor is copied into an owner segment. That is one copy, for value semantics:
//     the sender may change its tensor as soon as the call returns. A tensor whose storage
//     already IS a segment (every large tensor received this way) is sent by reference, without
//     a copy. The encoder adds one reference for the message. So an echo copies once (the
//     caller's copy-in). The callee's result is a reference to the caller's own segment, which
//     the caller views again. A tensor can be forwarded to a third process the same way.
//   * Receiver: the first decode of a message CLAIMS its ticket, and its tensor inherits the
//     message's reference. A duplicated frame (fault injection) finds its ticket claimed. It
//     takes a reference of its own, only while the count is live, so the counts stay exact. The
//     tensor's storage is the mapped segment (zero copy, storage_kind::shared_memory, handle
//     "rpc:<name>"); its deleter drops the reference. It checks the generation and that offset +
//     bytes fit inside its own mapping (sizes are never trusted beyond it).
//   * Sharing: a received large tensor is shared memory, like one from share_memory_(). When it
//     is sent on, every holder views the same bytes, and an in-place write by one is seen by
//     all. An ordinary tensor is never shared by sending it.
//   * Every process keeps one table of mappings, bounded (bulk_cache_limit). It holds its own
//     segments (while its pool or a tensor holds them) and peers' segments, least recently used
//     first. A peer's mapping is let go only by CAS 0 -> retired, never one in use. The owner
//     drops retired segments. The owner's pool is bounded (bulk_pool_limit) for what it RETAINS.
//     When every segment is in use, the pool grows anyway and sheds the surplus once it is free.
//   * A share_memory_() tensor (tensor kind 2, bulk_codec.cpp) is never copied. Its own handle
//     travels, and the receiver maps it, so writes are shared both ways. For file_descriptor the
//     receiver opens /proc/<pid>/fd/<fd>, checked like a segment; for file_system it opens the
//     name. The sender PINS its storage in a slot of its pin segment (a memfd of 4096 ticket
//     slots). The pin holds until the receiver has mapped it and cleared the slot. So a tensor
//     the sender drops at once still arrives. The I/O thread and the next pin() sweep cleared
//     slots; drop_peer() and teardown release the rest. A handle coming back to the process that
//     sent it resolves to the same storage (remembered weakly by name).
//   * A message never decoded (dropped, peer died) keeps its reference. The segment stays in
//     use until its owner drops that peer's pool (peer_down) or tears down. A dead peer's
//     references die with it the same way. A node's teardown also lets go of every unused peer
//     mapping.
//
//   owner: CAS 0->1, memcpy --pid,fd,name,gen,offset,ticket--> receiver: map (cached), claim,
//   view; tensor sent on: refs+1 --> ... ; every tensor dies -> refs 0 -> free for the owner
//
// Only memfds named "troupe_rpc_..." are ever opened by a receiver.
//
// Note [shm reachability]
//
// The same CAF host id does not prove that a peer can open this process's memfds. Processes in
// different pid namespaces (containers sharing the host's network) cannot. Nor can processes
// without ptrace-read access to each other. So a node sends a tensor through shared memory only
// to a peer that showed it can, during the hello (messages.hpp). To any other peer, and before
// the handshake, tensors travel as inline bytes (kind 0), share_memory_() tensors as ordinary
// copies.
//
//   A --hello{probe_A}--> B: B opens probe_A like a segment: ok_B
//   A <--hello_ack{probe_B, shm_ok = ok_B}-- B: reachable_A[B] = ok_B; A opens probe_B: ok_A
//   A --shm_verdict{ok_A}--> B's agent, and channel_auth{..., shm_ok = ok_A} on the direct
//   connection: reachable_B[A] = ok_A before any request of A's is read on either path
//
// Access need not be symmetric: a process that dropped its capabilities may not read one that
// kept them, while the reverse is allowed. So each side is told by the other. A later hello
// (B calling A) repeats the exchange the other way round with the same outcome.
//
// A probe is a 4 KiB memfd named troupe_rpc_probe_..., opened and checked exactly as a
// segment is (open_peer_memfd), then closed. node_options::shared_memory_rpc = false sends no
// probe and marks no peer reachable, so both directions of every connection use inline bytes.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/node_id.hpp>

#include "rpc/byte_pool.hpp"
#include "rpc/cuda_ipc.hpp"
#include "troupe/actors/messages.hpp"

namespace troupe::detail {

/// Tensors at least this large go through shared memory between same-host processes.
inline constexpr std::size_t bulk_threshold = std::size_t{1} << 20;
/// Most bytes of pooled segments one node keeps mapped as a sender.
inline constexpr std::size_t bulk_pool_limit = std::size_t{512} << 20;
/// Most bytes of peers' segments one process keeps mapped as a receiver.
inline constexpr std::size_t bulk_cache_limit = std::size_t{512} << 20;

struct seg_mapping;

/// One pooled segment of an owner (see Note [tensor over shared memory]).
struct bulk_segment {
  std::shared_ptr<seg_mapping> map;  ///< also held by every local tensor that views it
  std::size_t capacity = 0;          ///< payload bytes
  std::uint64_t gen = 0;             ///< generation of the last transfer
};

/// A node's pools of sending segments, one per peer node. Thread-safe.
class bulk_names {
 public:
  bulk_names() = default;
  ~bulk_names();
  bulk_names(const bulk_names&) = delete;
  bulk_names& operator=(const bulk_names&) = delete;

  /// Closes the pools (later acquire() calls return nullptr), drops every segment not in use
  /// and lets go of this process's unused mappings of peers' segments. Node teardown.
  void unlink_all();
  /// `peer` (a node id string) is gone: its pool is dropped. The kernel frees the segments it
  /// still held once no local tensor views them.
  void drop_peer(const std::string& peer);
  /// A segment for `peer` with room for `nbytes`, now holding one reference. Its generation is
  /// bumped and written to the header. nullptr when the pool is closed or cannot grow.
  bulk_segment* acquire(const std::string& peer, std::size_t nbytes);

  /// Where a pin is: a slot of this node's pin segment holding `ticket` until the receiver
  /// clears it.
  struct pin_ref {
    std::shared_ptr<seg_mapping> segment;
    std::uint32_t slot = 0;
    std::uint64_t ticket = 0;
  };
  /// Keeps `keep` (a shared tensor's storage, sent by handle) alive until the receiving peer
  /// has mapped it and cleared the slot. False when the pool is closed or no slot is free (the
  /// caller then copies the tensor instead).
  bool pin(const std::string& peer, std::shared_ptr<const void> keep, pin_ref& out);
  /// Lets go of the pins whose slot the receiver cleared. Cheap when nothing is pinned; the
  /// direct channel's I/O thread calls it on every wake.
  void sweep_pins();

  /// Note [shm reachability]. Turns shared memory off for this node: probe() is empty and no
  /// peer is reachable from now on.
  void disable_shared_memory();
  bool shared_memory_enabled() const { return enabled_.load(std::memory_order_relaxed); }
  /// This node's probe (created on first use); pid 0 when off or no memfd could be made.
  shm_probe probe();
  /// Whether `peer` (a node id string) can open this node's segments. Unknown peers cannot.
  bool reachable(const std::string& peer);
  void set_reachable(const std::string& peer, bool ok);

  /// Note [byte pool]: the node's buffers of large payloads sent or received as bytes.
  byte_pool& buffers() { return buffers_; }
  /// Note [rpc device map]: the peers' CUDA allocations this node opened by IPC handle (dropped
  /// with their peer, closed at teardown).
  cuda_ipc_cache& ipc() { return ipc_; }

 private:
  struct pinned {
    std::string peer;
    std::uint32_t slot;
    std::uint64_t ticket;
    std::shared_ptr<const void> keep;
  };
  void drop_retired();
  void make_room(std::size_t need);
  void sweep_pins_locked(std::vector<std::shared_ptr<const void>>& released);
  std::mutex mutex_;
  std::shared_ptr<seg_mapping> pin_segment_;
  std::vector<pinned> pinned_;
  std::vector<std::uint32_t> free_slots_;
  std::atomic<std::size_t> npinned_{0};
  std::map<std::string, std::vector<std::unique_ptr<bulk_segment>>> pool_;
  std::size_t pooled_bytes_ = 0;
  bool closed_ = false;
  std::atomic<bool> enabled_{true};
  std::shared_ptr<seg_mapping> probe_;
  std::map<std::string, bool> reachable_;
  byte_pool buffers_;
  cuda_ipc_cache ipc_;
};

/// Whether this process can open `p` (another process's probe) like a segment. Never throws.
bool can_open_probe(const shm_probe& p);

/// Whether two CAF nodes run on the same host.
bool same_host(const caf::node_id& a, const caf::node_id& b);
/// Whether two CAF nodes run on the same host in different processes (CUDA IPC is possible).
bool same_host_other_process(const caf::node_id& a, const caf::node_id& b);

}  // namespace troupe::detail
