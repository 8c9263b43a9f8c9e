// Note [tensor over shared memory] (bulk.hpp): segments, their reference counts, the owner's pools
// and the process's table of mappings. The codec side (write/read of kind-1 tensors) is at the end.
#include "rpc/bulk.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <deque>
#include <list>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include <caf/node_id.hpp>

#include "troupe/actors/rpc/codec.hpp"
#include "troupe/tensors/factories.hpp"

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

namespace {

thread_local bool tl_enabled = false;
thread_local bulk_names* tl_names = nullptr;
thread_local caf::node_id tl_peer;
std::atomic<std::uint64_t> counter{0};
constexpr const char* prefix = "troupe_rpc_";
constexpr const char* handle_tag = "rpc:";  // storage::shared_handle() of a tensor viewing a segment
constexpr std::size_t header_bytes = 4096;  // keeps the payload page-aligned
constexpr std::uint32_t refs_free = 0, refs_retired = UINT32_MAX;
constexpr std::size_t max_claimed = 1 << 16;  // tickets remembered against duplicated frames

/// The first bytes of every segment.
struct segment_header {
  std::atomic<std::uint32_t> refs;
  std::uint32_t reserved;
  std::atomic<std::uint64_t> gen;
};
static_assert(sizeof(segment_header) <= header_bytes);
static_assert(std::atomic<std::uint32_t>::is_always_lock_free && std::atomic<std::uint64_t>::is_always_lock_free,
              "segment header atomics must be lock-free to work across processes");

segment_header* header_of(void* base) { return static_cast<segment_header*>(base); }

bool cas_refs(void* base, std::uint32_t from, std::uint32_t to) {
  return header_of(base)->refs.compare_exchange_strong(from, to, std::memory_order_acq_rel);
}

// One more reference, only while the segment is in use (never from free or retired).
bool try_ref(segment_header* h) {
  std::uint32_t v = h->refs.load(std::memory_order_acquire);
  while (v != refs_free && v != refs_retired && v != refs_retired - 1)
    if (h->refs.compare_exchange_weak(v, v + 1, std::memory_order_acq_rel)) return true;
  return false;
}

void release_ref(segment_header* h) { h->refs.fetch_sub(1, std::memory_order_acq_rel); }

// Random per process, drawn again in a forked child (spawn forks after segments were made), so
// neither segment names nor tickets of two processes ever collide.
std::uint64_t process_nonce() {
  static std::mutex mu;
  static pid_t owner = 0;
  static std::uint64_t nonce = 0;
  std::lock_guard<std::mutex> lock(mu);
  if (owner != ::getpid()) {
    std::random_device rd;
    nonce = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    owner = ::getpid();
  }
  return nonce;
}

std::size_t size_class(std::size_t nbytes) {
  std::size_t c = bulk_threshold;
  while (c < nbytes) c <<= 1;
  return c;
}

// Maps `fd` (len bytes, read-write, pages populated in one go rather than faulted one by one).
void* map_fd(int fd, std::size_t len) {
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

/// Every segment this process maps: its own (weakly: the pool and tensors hold them) and peers'
/// (an LRU bounded by bulk_cache_limit), plus the tickets already claimed.
class segment_table {
 public:
  void add_own(const std::shared_ptr<seg_mapping>& m);
  /// The mapping of segment `name` owned by process `pid` (its memfd `fd` there). Throws
  /// io_error when it cannot be opened, protocol_violation when the file is not that segment.
  std::shared_ptr<seg_mapping> get(const std::string& name, int pid, int fd);
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
  std::unordered_set<std::uint64_t> claimed_;
  std::deque<std::uint64_t> claim_order_;
};

segment_table& table() {
  static auto* t = new segment_table();  // leaked: decoders may run during static destruction
  return *t;
}

void segment_table::add_own(const std::shared_ptr<seg_mapping>& m) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (own_.size() > 64)
    std::erase_if(own_, [](const auto& kv) { return kv.second.expired(); });
  own_[m->name] = m;
}

std::shared_ptr<seg_mapping> segment_table::get(const std::string& name, int pid, int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (pid == ::getpid()) {
    auto it = own_.find(name);
    if (it != own_.end())
      if (auto m = it->second.lock()) return m;
  }
  auto it = index_.find(name);
  if (it != index_.end()) {
    lru_.splice(lru_.end(), lru_, it->second);  // most recently used last
    return it->second->second;
  }
  auto m = open(name, pid, fd);
  evict(m->len, bulk_cache_limit);
  lru_.emplace_back(name, m);
  index_[name] = std::prev(lru_.end());
  bytes_ += m->len;
  return m;
}

std::shared_ptr<seg_mapping> segment_table::open(const std::string& name, int pid, int fd) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const int f = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (f < 0)
    throw error(errc::io_error, "shared-memory tensor " + name + " of process " + std::to_string(pid) +
                                    " cannot be opened (" + path + "): " + std::strerror(errno));
  // The file we got must be that memfd: a reused pid or fd number fails here.
  char link[512];
  const std::string self = "/proc/self/fd/" + std::to_string(f);
  const ssize_t k = ::readlink(self.c_str(), link, sizeof link - 1);
  const std::string want = "/memfd:" + name + " (deleted)";
  struct stat st {};
  if (k < 0 || std::string(link, static_cast<std::size_t>(k)) != want || ::fstat(f, &st) != 0 ||
      static_cast<std::uint64_t>(st.st_size) < header_bytes) {
    ::close(f);
    throw error(errc::protocol_violation, "shared-memory tensor " + name + ": " + path + " is not that segment (its owner exited?)");
  }
  const auto len = static_cast<std::size_t>(st.st_size);
  void* p = map_fd(f, len);
  ::close(f);
  if (!p) throw error(errc::io_error, "mmap of shared-memory tensor " + name + " failed: " + std::strerror(errno));
  return std::make_shared<seg_mapping>(p, len, -1, pid, fd, name);
}

// Caller holds mutex_. Lets go of unused peers' mappings (CAS free -> retired: never one in use;
// retired ones another process retired) until `need` more bytes fit under `limit`.
void segment_table::evict(std::size_t need, std::size_t limit) {
  for (auto it = lru_.begin(); it != lru_.end() && bytes_ + need > limit;) {
    auto* h = header_of(it->second->base);
    if (h->refs.load(std::memory_order_acquire) != refs_retired && !cas_refs(it->second->base, refs_free, refs_retired)) {
      ++it;
      continue;
    }
    bytes_ -= it->second->len;
    index_.erase(it->first);
    it = lru_.erase(it);
  }
}

void segment_table::drop_unused() {
  std::lock_guard<std::mutex> lock(mutex_);
  evict(1, 0);
}

bool segment_table::claim(std::uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!claimed_.insert(ticket).second) return false;
  claim_order_.push_back(ticket);
  if (claim_order_.size() > max_claimed) {
    claimed_.erase(claim_order_.front());
    claim_order_.pop_front();
  }
  return true;
}

// A new segment of `capacity` payload bytes, mapped, holding one reference; nullptr on failure.
std::unique_ptr<bulk_segment> create_segment(std::size_t capacity) {
  const std::string name = std::string(prefix) + std::to_string(::getpid()) + "_" + std::to_string(process_nonce()) + "_" +
                           std::to_string(counter.fetch_add(1));
  const std::size_t len = header_bytes + capacity;
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  void* p = ::ftruncate(fd, static_cast<off_t>(len)) == 0 ? map_fd(fd, len) : nullptr;
  if (!p) {
    ::close(fd);
    return nullptr;
  }
  auto seg = std::make_unique<bulk_segment>();
  seg->map = std::make_shared<seg_mapping>(p, len, fd, static_cast<int>(::getpid()), fd, name);
  seg->capacity = capacity;
  header_of(p)->refs.store(1, std::memory_order_release);
  table().add_own(seg->map);
  return seg;
}

}  // namespace

bulk_names::~bulk_names() { unlink_all(); }

void bulk_names::unlink_all() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    make_room(bulk_pool_limit + 1);  // retires and drops every free segment
  }
  table().drop_unused();
}

void bulk_names::drop_peer(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pool_.find(peer);
  if (it == pool_.end()) return;
  for (auto& s : it->second) {
    cas_refs(s->map->base, refs_free, refs_retired);  // other processes' caches let go of it too
    pooled_bytes_ -= s->map->len;
  }
  pool_.erase(it);
}

// Caller holds mutex_. Segments retired by a peer's cache are never used again.
void bulk_names::drop_retired() {
  for (auto& [peer, segs] : pool_) {
    for (auto it = segs.begin(); it != segs.end();) {
      if (header_of((*it)->map->base)->refs.load(std::memory_order_acquire) != refs_retired) {
        ++it;
        continue;
      }
      pooled_bytes_ -= (*it)->map->len;
      it = segs.erase(it);
    }
  }
}

// Caller holds mutex_. Retires free segments until `need` more bytes fit under the limit.
void bulk_names::make_room(std::size_t need) {
  std::size_t retired = 0;
  for (auto& [peer, segs] : pool_)
    for (auto& s : segs)
      if (pooled_bytes_ - retired + need > bulk_pool_limit && cas_refs(s->map->base, refs_free, refs_retired))
        retired += s->map->len;
  drop_retired();
}

bulk_segment* bulk_names::acquire(const std::string& peer, std::size_t nbytes) {
  const std::size_t capacity = size_class(nbytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return nullptr;
  auto& segs = pool_[peer];
  bulk_segment* found = nullptr;
  for (auto& s : segs)
    if (s->capacity == capacity && cas_refs(s->map->base, refs_free, 1)) {
      found = s.get();
      break;
    }
  if (!found) {
    drop_retired();
    // Over the limit with every segment in use (receivers still hold them), the pool grows
    // anyway; make_room() retires the surplus once it is free again.
    if (pooled_bytes_ + header_bytes + capacity > bulk_pool_limit) make_room(header_bytes + capacity);
    auto seg = create_segment(capacity);
    if (!seg) return nullptr;
    pooled_bytes_ += seg->map->len;
    found = seg.get();
    segs.push_back(std::move(seg));
  }
  header_of(found->map->base)->gen.store(++found->gen, std::memory_order_release);
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

}  // namespace troupe::detail

namespace troupe::rpc::detail {

namespace d = troupe::detail;

void write_tensor_header(writer& w, const tensor& h);  // codec.cpp

namespace {

/// What a segment-backed storage's data_ptr context is: the mapping it keeps alive.
struct seg_view {
  std::shared_ptr<d::seg_mapping> map;
};

const seg_view* view_of(const storage& s) {
  if (s.kind() != storage_kind::shared_memory || s.shared_handle().rfind(d::handle_tag, 0) != 0) return nullptr;
  return static_cast<const seg_view*>(s.raw().context());
}

// Where a kind-1 tensor lives: the segment, the generation and the tensor's offset in it.
struct seg_ref {
  const d::seg_mapping* map = nullptr;
  std::uint64_t gen = 0;
  std::uint64_t offset = 0;
};

std::uint64_t new_ticket() {
  static std::atomic<std::uint64_t> next{0};
  return d::process_nonce() + 0x9e3779b97f4a7c15ULL * next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

bool write_tensor_bulk(writer& w, const tensor& h) {
  const std::size_t nbytes = h.nbytes();
  if (!d::tl_enabled || !d::tl_names || nbytes < d::bulk_threshold) return false;
  seg_ref ref;
  if (const seg_view* v = view_of(*h.storage())) {  // already a segment: one more reference, no copy
    auto* hdr = d::header_of(v->map->base);
    hdr->refs.fetch_add(1, std::memory_order_acq_rel);  // our tensor holds one, so it is in use
    ref = {v->map.get(), hdr->gen.load(std::memory_order_acquire),
           static_cast<std::uint64_t>(static_cast<const char*>(h.data_ptr()) - static_cast<const char*>(v->map->base)) -
               d::header_bytes};
  } else {
    d::bulk_segment* seg = d::tl_names->acquire(d::tl_peer ? caf::to_string(d::tl_peer) : std::string(), nbytes);
    if (!seg) return false;  // pool closed or no segment: inline bytes
    std::memcpy(static_cast<char*>(seg->map->base) + d::header_bytes, h.data_ptr(), nbytes);
    ref = {seg->map.get(), seg->gen, 0};
  }
  w.pod(std::uint8_t{1});  // kind 1: a segment
  w.pod(std::uint8_t{1});  // defined
  write_tensor_header(w, h);
  w.str(ref.map->name);
  w.pod(ref.gen);
  w.pod(static_cast<std::int32_t>(ref.map->pid));
  w.pod(static_cast<std::int32_t>(ref.map->owner_fd));
  w.pod(ref.offset);
  w.pod(new_ticket());
  return true;
}

namespace {

// Takes this decode's reference (the message's on the first decode of its ticket, a new one for a
// duplicate) and checks the generation; throws protocol_violation when the segment moved on.
void take_reference(d::segment_header* hdr, const std::string& name, std::uint64_t gen, std::uint64_t ticket) {
  const bool first = d::table().claim(ticket);
  const std::uint32_t refs = hdr->refs.load(std::memory_order_acquire);
  const bool live = first ? refs != d::refs_free && refs != d::refs_retired : d::try_ref(hdr);
  if (live && hdr->gen.load(std::memory_order_acquire) == gen) return;
  if (live && !first) d::release_ref(hdr);
  throw error(errc::protocol_violation, "shared-memory tensor " + name + " generation " + std::to_string(gen) + " is stale");
}

}  // namespace

// A tensor whose storage is the (cached) mapping of the segment; its deleter drops the
// reference. Only the mapping's own length bounds what is read.
tensor read_tensor_bulk(reader& r, const shape_t& sizes, troupe::dtype dt, std::uint64_t nbytes) {
  std::string name;
  std::uint64_t gen = 0, offset = 0, ticket = 0;
  std::int32_t pid = 0, fd = -1;
  r.str(name);
  r.pod(gen);
  r.pod(pid);
  r.pod(fd);
  r.pod(offset);
  r.pod(ticket);
  if (name.rfind(d::prefix, 0) != 0 || name.find('/') != std::string::npos || pid <= 0 || fd < 0)
    throw error(errc::protocol_violation, "shared-memory tensor name '" + name + "' is not a troupe rpc segment");
  auto m = d::table().get(name, pid, fd);
  const std::size_t capacity = m->len - d::header_bytes;
  if (offset > capacity || nbytes > capacity - offset)
    throw error(errc::protocol_violation, "shared-memory tensor " + name + " is smaller than its " + std::to_string(nbytes) +
                                              " bytes at offset " + std::to_string(offset));
  take_reference(d::header_of(m->base), name, gen, ticket);
  auto* ctx = new seg_view{std::move(m)};
  data_ptr view(static_cast<char*>(ctx->map->base) + d::header_bytes + offset, cpu_device,
                [](void* c, void*) noexcept {
                  auto* v = static_cast<seg_view*>(c);
                  d::release_ref(d::header_of(v->map->base));
                  delete v;
                },
                ctx);
  auto impl = std::make_shared<tensor_impl>();
  impl->storage = std::make_shared<storage>(std::move(view), nbytes, storage_kind::shared_memory);
  impl->storage->set_shared_handle(d::handle_tag + name);
  impl->sizes = sizes;
  impl->strides = contiguous_strides(sizes);
  impl->dtype = dt;
  return tensor(std::move(impl));
}

}  // namespace troupe::rpc::detail
