#pragma once
// Large tensors between processes of one host travel through shared memory, not the CAF
// connection (CAF-0.17-NOTES pitfall 8: one TCP connection per node pair, head-of-line blocking).
//
// Note [tensor over shared memory]
// While a node encodes a payload for a peer on the same host (same CAF host id), a bulk_scope
// is active on the encoding thread. write_tensor then copies every tensor of at least
// `bulk_threshold` bytes into a POOLED, already-faulted POSIX shared-memory segment and writes
// only its name and a generation (tensor kind 1). A fresh segment per transfer made the kernel
// allocate and zero every page on both sides (~40 ms per direction for 64 MB, 3x the copy), so
// segments are kept and reused:
//
//   * Sender (bulk_names, one per node): a pool per peer node; payload capacities are powers of
//     two >= 1 MiB after a 4 KiB header page. A segment is named
//     "/troupe_rpc_<pid>_<nonce>_<n>" (random nonce per process: a name is never reused, even
//     across pid reuse) and mapped once with MAP_POPULATE. Its header holds an atomic state
//     (0 free, 1 in flight, 2 retired) and the generation of the transfer in flight. The sender
//     takes a segment only by CAS 0 -> 1, so a segment is never handed out twice while in use.
//   * Receiver (one cache per process): the first transfer through a segment opens it, UNLINKS
//     the name (nothing lingers in /dev/shm while both sides live) and keeps the mapping, keyed
//     by name; later transfers reuse it (no open/mmap/munmap per call). It checks the generation
//     and that header + bytes fit inside its own mapping (sizes are never trusted beyond it).
//     The received tensor's storage IS the segment (zero copy, storage_kind::shared_memory); the
//     storage's deleter stores state 0, handing the segment back to the sender. Measured against
//     copying out into an ordinary tensor: 64 MB echo 17-18 ms vs 35-37 ms, so the copy out is
//     gone. A received tensor kept alive pins its segment; the sender then uses another one.
//   * Pooled per peer because only that peer's process holds the mapping of an unlinked name.
//     The receiver's cache is bounded (bulk_cache_limit): it evicts a mapping only by CAS
//     0 -> 2 (never one in flight or held by a tensor); the sender drops retired segments.
//   * The sender's pool is bounded (bulk_pool_limit) for what it RETAINS: over it, free segments
//     are retired; when every segment is in flight the pool grows anyway and sheds the surplus
//     once it is free again.
//   * A message never decoded (dropped, peer died) leaves its segment in flight until the node
//     tears down; bulk_names::unlink_all() unlinks every name the node created (names a receiver
//     already unlinked are gone), the destructor unmaps. A SIGKILLed process leaks only the
//     names it created that nobody opened yet.
//
//   sender: CAS free->in flight, memcpy --name,gen--> [CAF] --> receiver: cached map, tensor
//   view; tensor dies -> state free
//
// Only names with the "/troupe_rpc_" prefix are ever opened or unlinked by a receiver.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/node_id.hpp>

namespace troupe::detail {

/// Tensors at least this large go through shared memory between same-host processes.
inline constexpr std::size_t bulk_threshold = std::size_t{1} << 20;
/// Most bytes of pooled segments one node keeps mapped as a sender.
inline constexpr std::size_t bulk_pool_limit = std::size_t{512} << 20;
/// Most bytes of peers' segments one process keeps mapped as a receiver.
inline constexpr std::size_t bulk_cache_limit = std::size_t{512} << 20;

/// One pooled segment of a sender (see Note [tensor over shared memory]).
struct bulk_segment {
  std::string name;
  void* base = nullptr;
  std::size_t map_len = 0;   ///< header page + capacity
  std::size_t capacity = 0;  ///< payload bytes
  std::uint64_t gen = 0;     ///< generation of the last transfer
};

/// A node's pool of sending segments, and the names it created (unlinked at teardown).
/// Thread-safe.
class bulk_names {
 public:
  bulk_names() = default;
  ~bulk_names();
  bulk_names(const bulk_names&) = delete;
  bulk_names& operator=(const bulk_names&) = delete;

  /// Records a name to unlink at teardown.
  void add(std::string name);
  /// Unlinks every recorded name still present; later acquire() calls return nullptr.
  void unlink_all();
  /// A segment for `peer` with room for `nbytes`, now in flight (its generation bumped and
  /// written to the header), or nullptr when the pool is closed or full.
  bulk_segment* acquire(const std::string& peer, std::size_t nbytes);

 private:
  void drop_retired();
  void make_room(std::size_t need);
  std::mutex mutex_;
  std::vector<std::string> names_;
  std::map<std::string, std::vector<std::unique_ptr<bulk_segment>>> pool_;
  std::size_t pooled_bytes_ = 0;
  bool closed_ = false;
};

/// Makes write_tensor use shared memory on this thread while alive (nested scopes restore).
/// `peer` is the node the payload goes to (segments are pooled per peer).
class bulk_scope {
 public:
  bulk_scope(bool enabled, bulk_names* names, caf::node_id peer = {});
  ~bulk_scope();
  bulk_scope(const bulk_scope&) = delete;
  bulk_scope& operator=(const bulk_scope&) = delete;

 private:
  bool prev_enabled_;
  bulk_names* prev_names_;
  caf::node_id prev_peer_;
};

/// Whether two CAF nodes run on the same host.
bool same_host(const caf::node_id& a, const caf::node_id& b);

}  // namespace troupe::detail
