#pragma once
// Internals of Note [tensor over shared memory] (rpc/bulk.hpp). bulk.cpp uses them for
// segments, pools and the process's table of mappings; bulk_codec.cpp for tensor kinds 1 and 2 and
// pins.

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include <caf/node_id.hpp>

#include "rpc/bulk.hpp"
#include "troupe/tensors/storage.hpp"

namespace troupe::detail {

/// A segment as this process maps it. The owner keeps its memfd open (`fd`; peers open it
/// through /proc/<pid>/fd/<owner_fd>); a peer's mapping has fd -1. Unmapped when the last holder
/// lets go.
struct seg_mapping {
  void* base = nullptr;
  std::size_t len = 0;  ///< header page + capacity
  int fd = -1;          ///< our descriptor of the memfd (owner only)
  int pid = 0;          ///< the owner
  int owner_fd = -1;    ///< the memfd's descriptor number in the owner
  std::string name;
  seg_mapping(void* b, std::size_t l, int f, int p, int of, std::string n)
      : base(b), len(l), fd(f), pid(p), owner_fd(of), name(std::move(n)) {}
  ~seg_mapping() {
    ::munmap(base, len);
    if (fd >= 0) ::close(fd);
  }
  seg_mapping(const seg_mapping&) = delete;
  seg_mapping& operator=(const seg_mapping&) = delete;
};

inline constexpr const char* seg_prefix = "troupe_rpc_";  ///< every memfd a receiver may open
inline constexpr const char* seg_handle_tag = "rpc:";     ///< storage::shared_handle() of a segment view
inline constexpr std::size_t header_bytes = 4096;         ///< keeps the payload page-aligned
inline constexpr std::uint32_t refs_free = 0, refs_retired = UINT32_MAX;

/// The first bytes of every segment.
struct segment_header {
  std::atomic<std::uint32_t> refs;
  std::uint32_t reserved;
  std::atomic<std::uint64_t> gen;
};
static_assert(sizeof(segment_header) <= header_bytes);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free && std::atomic<std::uint64_t>::is_always_lock_free,
              "segment header atomics must be lock-free to work across processes");

inline segment_header* header_of(void* base) { return static_cast<segment_header*>(base); }

inline bool cas_refs(void* base, std::uint32_t from, std::uint32_t to) {
  return header_of(base)->refs.compare_exchange_strong(from, to, std::memory_order_acq_rel);
}

/// One more reference, only while the segment is in use (never from free or retired).
inline bool try_ref(segment_header* h) {
  std::uint32_t v = h->refs.load(std::memory_order_acquire);
  while (v != refs_free && v != refs_retired && v != refs_retired - 1)
    if (h->refs.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) return true;
  return false;
}

inline void release_ref(segment_header* h) { h->refs.fetch_sub(1, std::memory_order_acq_rel); }

/// Random per process, drawn again in a forked child, so names and tickets never collide.
std::uint64_t process_nonce();
/// A fresh ticket, unique across processes.
std::uint64_t new_ticket();
/// Maps `fd` read-write and shared, pages populated at once; nullptr on failure.
void* map_shared(int fd, std::size_t len);
/// A new memfd of `len` bytes named `name`, mapped; nullptr on failure.
std::shared_ptr<seg_mapping> create_memfd_mapping(const std::string& name, std::size_t len);
/// Opens memfd `fd` of process `pid` through /proc and checks it is the memfd called `name`
/// (a reused pid or fd number fails). Returns our descriptor; throws io_error when it cannot be
/// opened, protocol_violation when it is another file.
int open_peer_memfd(const std::string& name, int pid, int fd);

/// Every segment this process maps, plus the tickets claimed. That is its own segments (weakly:
/// the pool and tensors hold them), peers' (an LRU bounded by bulk_cache_limit) and peers' pin
/// segments.
class segment_table {
 public:
  void add_own(const std::shared_ptr<seg_mapping>& m);
  /// The mapping of segment `name` owned by process `pid` (its memfd `fd` there); errors as
  /// open_peer_memfd.
  std::shared_ptr<seg_mapping> get(const std::string& name, int pid, int fd);
  /// The mapping of a peer's pin segment (cached; see pin_table).
  std::shared_ptr<seg_mapping> pins(const std::string& name, int pid, int fd);
  /// Remembers (weakly) a share_memory_() storage this process sent by handle. So its own handle
  /// coming back resolves to the same storage instead of a second mapping.
  void add_own_shared(const std::string& name, const std::shared_ptr<storage>& s);
  /// That storage, if it is still alive.
  std::shared_ptr<storage> own_shared(const std::string& name);
  /// True the first time `ticket` is seen.
  bool claim(std::uint64_t ticket);
  /// Lets go of every peer's mapping nobody uses.
  void drop_unused();

 private:
  using entry = std::pair<std::string, std::shared_ptr<seg_mapping>>;
  static std::shared_ptr<seg_mapping> open(const std::string& name, int pid, int fd);
  void evict(std::size_t need, std::size_t limit);
  std::mutex mutex_;
  std::unordered_map<std::string, std::weak_ptr<seg_mapping>> own_;
  std::list<entry> lru_;
  std::unordered_map<std::string, std::list<entry>::iterator> index_;
  std::size_t bytes_ = 0;
  std::unordered_map<std::string, std::shared_ptr<seg_mapping>> pins_;
  std::unordered_map<std::string, std::weak_ptr<storage>> own_shared_;
  std::unordered_set<std::uint64_t> claimed_;
  std::deque<std::uint64_t> claim_order_;
};

/// The process's table (never destroyed: decoders may run during static destruction).
segment_table& table();

}  // namespace troupe::detail
