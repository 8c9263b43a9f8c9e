// Note [tensor over shared memory] (bulk.hpp).
#include "rpc/bulk.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <list>
#include <random>
#include <unordered_map>

#include <caf/node_id.hpp>

#include "troupe/actors/rpc/codec.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::detail {

namespace {

thread_local bool tl_enabled = false;
thread_local bulk_names* tl_names = nullptr;
thread_local caf::node_id tl_peer;
std::atomic<std::uint64_t> counter{0};
constexpr const char* prefix = "/troupe_rpc_";
constexpr std::size_t header_bytes = 4096;  // keeps the payload page-aligned
constexpr std::uint32_t state_free = 0, state_in_flight = 1, state_retired = 2;

/// The first bytes of every segment.
struct segment_header {
  std::atomic<std::uint32_t> state;
  std::uint32_t reserved;
  std::atomic<std::uint64_t> gen;
};
static_assert(sizeof(segment_header) <= header_bytes);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free && std::atomic<std::uint64_t>::is_always_lock_free,
              "segment header atomics must be lock-free to work across processes");

segment_header* header_of(void* base) { return static_cast<segment_header*>(base); }

bool cas_state(void* base, std::uint32_t from, std::uint32_t to) {
  return header_of(base)->state.compare_exchange_strong(from, to, std::memory_order_acq_rel);
}

std::uint64_t process_nonce() {
  static const std::uint64_t nonce = [] {
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  }();
  return nonce;
}

// Maps `fd` (len bytes, read-write, pages populated in one go rather than faulted one by one);
// closes fd.
void* map_segment(int fd, std::size_t len, const std::string& name) {
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw error(errc::io_error, "mmap of shared-memory segment " + name + " failed: " + std::strerror(errno));
  return p;
}

std::size_t size_class(std::size_t nbytes) {
  std::size_t c = bulk_threshold;
  while (c < nbytes) c <<= 1;
  return c;
}

// A new segment of `capacity` payload bytes, mapped and marked in flight; nullptr on failure.
std::unique_ptr<bulk_segment> create_segment(std::size_t capacity) {
  auto seg = std::make_unique<bulk_segment>();
  seg->name = std::string(prefix) + std::to_string(::getpid()) + "_" + std::to_string(process_nonce()) + "_" +
              std::to_string(counter.fetch_add(1));
  seg->capacity = capacity;
  seg->map_len = header_bytes + capacity;
  const int fd = ::shm_open(seg->name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return nullptr;
  if (::ftruncate(fd, static_cast<off_t>(seg->map_len)) != 0) {
    ::close(fd);
    ::shm_unlink(seg->name.c_str());
    return nullptr;
  }
  void* p = ::mmap(nullptr, seg->map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    ::shm_unlink(seg->name.c_str());
    return nullptr;
  }
  seg->base = p;
  header_of(p)->state.store(state_in_flight, std::memory_order_release);
  return seg;
}

}  // namespace

bulk_names::~bulk_names() {
  unlink_all();
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [peer, segs] : pool_)
    for (auto& s : segs) ::munmap(s->base, s->map_len);
}

void bulk_names::add(std::string name) {
  std::lock_guard<std::mutex> lock(mutex_);
  names_.push_back(std::move(name));
}

void bulk_names::unlink_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& n : names_) ::shm_unlink(n.c_str());  // ENOENT: the receiver already did
  names_.clear();
  closed_ = true;
}

// Caller holds mutex_. Segments the receiver evicted are never used again.
void bulk_names::drop_retired() {
  for (auto& [peer, segs] : pool_) {
    for (auto it = segs.begin(); it != segs.end();) {
      if (header_of((*it)->base)->state.load(std::memory_order_acquire) != state_retired) {
        ++it;
        continue;
      }
      ::munmap((*it)->base, (*it)->map_len);
      pooled_bytes_ -= (*it)->map_len;
      it = segs.erase(it);
    }
  }
}

// Caller holds mutex_. Retires free segments until `need` more bytes fit under the limit.
void bulk_names::make_room(std::size_t need) {
  std::size_t retired = 0;
  for (auto& [peer, segs] : pool_)
    for (auto& s : segs)
      if (pooled_bytes_ - retired + need > bulk_pool_limit && cas_state(s->base, state_free, state_retired))
        retired += s->map_len;
  drop_retired();
}

bulk_segment* bulk_names::acquire(const std::string& peer, std::size_t nbytes) {
  const std::size_t capacity = size_class(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return nullptr;
  auto& segs = pool_[peer];
  bulk_segment* found = nullptr;
  for (auto& s : segs)
    if (s->capacity == capacity && cas_state(s->base, state_free, state_in_flight)) {
      found = s.get();
      break;
    }
  if (!found) {
    drop_retired();
    // Over the limit with every segment in flight (receivers still hold them), the pool grows
    // anyway; make_room() retires the surplus once it is free again.
    if (pooled_bytes_ + header_bytes + capacity > bulk_pool_limit) make_room(header_bytes + capacity);
    auto seg = create_segment(capacity);
    if (!seg) return nullptr;
    names_.push_back(seg->name);
    pooled_bytes_ += seg->map_len;
    found = seg.get();
    segs.push_back(std::move(seg));
  }
  header_of(found->base)->gen.store(++found->gen, std::memory_order_release);
  return found;
}

bulk_scope::bulk_scope(bool enabled, bulk_names* names, caf::node_id peer)
    : prev_enabled_(tl_enabled), prev_names_(tl_names), prev_peer_(std::move(tl_peer)) {
  tl_enabled = enabled;
  tl_names = names;
  tl_peer = std::move(peer);
}

bulk_scope::~bulk_scope() {
  tl_enabled = prev_enabled_;
  tl_names = prev_names_;
  tl_peer = std::move(prev_peer_);
}

bool same_host(const caf::node_id& a, const caf::node_id& b) {
  if (!a || !b) return false;
  const auto* x = dynamic_cast<const caf::node_id::default_data*>(&*a);
  const auto* y = dynamic_cast<const caf::node_id::default_data*>(&*b);
  return x && y && x->host_id() == y->host_id();
}

namespace {

/// A peer's segment as this process maps it (unmapped when the last user lets go).
struct mapping {
  void* base = nullptr;
  std::size_t len = 0;
  mapping(void* b, std::size_t l) : base(b), len(l) {}
  ~mapping() { ::munmap(base, len); }
  mapping(const mapping&) = delete;
  mapping& operator=(const mapping&) = delete;
};

/// The receiver's cache of peers' segments, keyed by name, least recently used first.
class receive_cache {
 public:
  std::shared_ptr<mapping> get(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = index_.find(name);
    if (it != index_.end()) {
      lru_.splice(lru_.end(), lru_, it->second);  // most recently used last
      return it->second->second;
    }
    auto m = open(name);
    evict(m->len);
    lru_.emplace_back(name, m);
    index_[name] = std::prev(lru_.end());
    bytes_ += m->len;
    return m;
  }

 private:
  using entry = std::pair<std::string, std::shared_ptr<mapping>>;

  static std::shared_ptr<mapping> open(const std::string& name) {
    const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
    if (fd < 0) throw error(errc::io_error, "shared-memory tensor " + name + " is gone: " + std::strerror(errno));
    ::shm_unlink(name.c_str());  // only the sender's and our mappings keep it now
    struct stat st {};
    if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < header_bytes) {
      ::close(fd);
      throw error(errc::protocol_violation, "shared-memory tensor " + name + " is smaller than its header");
    }
    const auto len = static_cast<std::size_t>(st.st_size);
    return std::make_shared<mapping>(map_segment(fd, len, name), len);
  }

  // Caller holds mutex_. Unmaps free segments (CAS free -> retired: never one in flight) until
  // `need` more bytes fit under the limit.
  void evict(std::size_t need) {
    for (auto it = lru_.begin(); it != lru_.end() && bytes_ + need > bulk_cache_limit;) {
      if (!cas_state(it->second->base, state_free, state_retired)) {
        ++it;
        continue;
      }
      bytes_ -= it->second->len;
      index_.erase(it->first);
      it = lru_.erase(it);
    }
  }

  std::mutex mutex_;
  std::list<entry> lru_;
  std::unordered_map<std::string, std::list<entry>::iterator> index_;
  std::size_t bytes_ = 0;
};

receive_cache& cache() {
  static auto* c = new receive_cache();  // leaked: decoders may run during static destruction
  return *c;
}

}  // namespace

}  // namespace troupe::detail

namespace troupe::rpc::detail {

void write_tensor_header(writer& w, const tensor& h);  // codec.cpp

bool write_tensor_bulk(writer& w, const tensor& h) {
  namespace d = troupe::detail;
  const std::size_t nbytes = h.nbytes();
  if (!d::tl_enabled || !d::tl_names || nbytes < d::bulk_threshold) return false;
  d::bulk_segment* seg = d::tl_names->acquire(d::tl_peer ? caf::to_string(d::tl_peer) : std::string(), nbytes);
  if (!seg) return false;  // pool full or closed: inline bytes
  std::memcpy(static_cast<char*>(seg->base) + d::header_bytes, h.data_ptr(), nbytes);
  w.pod(std::uint8_t{1});  // kind 1: a segment
  w.pod(std::uint8_t{1});  // defined
  write_tensor_header(w, h);
  w.str(seg->name);
  w.pod(static_cast<std::uint64_t>(seg->gen));
  return true;
}

// A tensor whose storage is the (cached) mapping of the sender's segment; the storage's deleter
// frees the segment for the sender's next transfer. Only the mapping's own length bounds what
// is read.
tensor read_tensor_bulk(reader& r, const shape_t& sizes, troupe::dtype dt, std::uint64_t nbytes) {
  namespace d = troupe::detail;
  std::string name;
  std::uint64_t gen = 0;
  r.str(name);
  r.pod(gen);
  if (name.rfind(d::prefix, 0) != 0 || name.find('/', 1) != std::string::npos)
    throw error(errc::protocol_violation, "shared-memory tensor name '" + name + "' is not a troupe rpc segment");
  auto m = d::cache().get(name);
  if (nbytes > m->len - d::header_bytes)
    throw error(errc::protocol_violation, "shared-memory tensor " + name + " is smaller than its " + std::to_string(nbytes) + " bytes");
  auto* hdr = d::header_of(m->base);
  if (hdr->gen.load(std::memory_order_acquire) != gen || hdr->state.load(std::memory_order_acquire) != d::state_in_flight)
    throw error(errc::protocol_violation, "shared-memory tensor " + name + " generation " + std::to_string(gen) + " is stale");
  // The tensor's storage is the segment itself; its deleter hands the segment back.
  auto* keep = new std::shared_ptr<d::mapping>(std::move(m));
  data_ptr view(static_cast<char*>((*keep)->base) + d::header_bytes, cpu_device,
                [](void* ctx, void*) noexcept {
                  auto* k = static_cast<std::shared_ptr<d::mapping>*>(ctx);
                  d::header_of((*k)->base)->state.store(d::state_free, std::memory_order_release);
                  delete k;
                },
                keep);
  auto impl = std::make_shared<tensor_impl>();
  impl->storage = std::make_shared<storage>(std::move(view), nbytes, storage_kind::shared_memory);
  impl->sizes = sizes;
  impl->strides = contiguous_strides(sizes);
  impl->dtype = dt;
  return tensor(std::move(impl));
}

}  // namespace troupe::rpc::detail
