// Note [tensor over shared memory] (bulk.hpp): segments, their reference counts, the owners' pools,
// pins and the process's table of mappings. The codec side (tensor kinds 1 and 2) is in
// bulk_codec.cpp.
#include "rpc/bulk.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "rpc/bulk_segment.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::detail {

namespace {

std::atomic<std::uint64_t> counter{0};
constexpr std::size_t max_claimed = 1 << 16;  // tickets remembered against duplicated frames
constexpr std::uint32_t pin_slots = 4096;     // shared tensors in flight per node

std::size_t size_class(std::size_t nbytes) {
  std::size_t c = bulk_threshold;
  while (c < nbytes) c <<= 1;
  return c;
}

std::string new_segment_name(const char* kind) {
  return std::string(seg_prefix) + kind + std::to_string(::getpid()) + "_" + std::to_string(process_nonce()) + "_" +
         std::to_string(counter.fetch_add(1));
}

}  // namespace

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

std::uint64_t new_ticket() {
  static std::atomic<std::uint64_t> next{0};
  return process_nonce() + 0x9e3779b97f4a7c15ULL * next.fetch_add(1, std::memory_order_relaxed);
}

void* map_shared(int fd, std::size_t len) {
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

std::shared_ptr<seg_mapping> create_memfd_mapping(const std::string& name, std::size_t len) {
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  void* p = ::ftruncate(fd, static_cast<off_t>(len)) == 0 ? map_shared(fd, len) : nullptr;
  if (!p) {
    ::close(fd);
    return nullptr;
  }
  return std::make_shared<seg_mapping>(p, len, fd, static_cast<int>(::getpid()), fd, name);
}

int open_peer_memfd(const std::string& name, int pid, int fd) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const int f = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (f < 0)
    throw error(errc::io_error, "shared-memory tensor " + name + " of process " + std::to_string(pid) +
                                    " cannot be opened (" + path + "): " + std::strerror(errno));
  char link[512];
  const std::string self = "/proc/self/fd/" + std::to_string(f);
  const ssize_t k = ::readlink(self.c_str(), link, sizeof link - 1);
  if (k < 0 || std::string(link, static_cast<std::size_t>(k)) != "/memfd:" + name + " (deleted)") {
    ::close(f);
    throw error(errc::protocol_violation, "shared-memory tensor " + name + ": " + path + " is not that segment (its owner exited?)");
  }
  return f;
}

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
  const int f = open_peer_memfd(name, pid, fd);
  struct stat st {};
  if (::fstat(f, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < header_bytes) {
    ::close(f);
    throw error(errc::protocol_violation, "shared-memory tensor " + name + " is smaller than its header");
  }
  const auto len = static_cast<std::size_t>(st.st_size);
  void* p = map_shared(f, len);
  ::close(f);
  if (!p) throw error(errc::io_error, "mmap of shared-memory tensor " + name + " failed: " + std::strerror(errno));
  return std::make_shared<seg_mapping>(p, len, -1, pid, fd, name);
}

void segment_table::add_own_shared(const std::string& name, const std::shared_ptr<storage>& s) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (own_shared_.size() > 64)
    std::erase_if(own_shared_, [](const auto& kv) { return kv.second.expired(); });
  own_shared_[name] = s;
}

std::shared_ptr<storage> segment_table::own_shared(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = own_shared_.find(name);
  return it == own_shared_.end() ? nullptr : it->second.lock();
}

std::shared_ptr<seg_mapping> segment_table::pins(const std::string& name, int pid, int fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = pins_.find(name);
  if (it != pins_.end()) return it->second;
  if (pins_.size() >= 64) pins_.clear();  // pin segments of long-gone peers
  auto m = open(name, pid, fd);
  pins_[name] = m;
  return m;
}

// Caller holds mutex_. Lets go of unused peers' mappings until `need` more bytes fit under
// `limit`. It lets go by CAS free -> retired, never one in use, or of ones another process retired.
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

namespace {

// A new segment of `capacity` payload bytes, mapped, holding one reference; nullptr on failure.
std::unique_ptr<bulk_segment> create_segment(std::size_t capacity) {
  auto map = create_memfd_mapping(new_segment_name(""), header_bytes + capacity);
  if (!map) return nullptr;
  auto seg = std::make_unique<bulk_segment>();
  seg->map = std::move(map);
  seg->capacity = capacity;
  header_of(seg->map->base)->refs.store(1, std::memory_order_release);
  table().add_own(seg->map);
  return seg;
}

}  // namespace

bulk_names::~bulk_names() { unlink_all(); }

void bulk_names::unlink_all() {
  ipc_.clear();
  std::vector<pinned> pins;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    make_room(bulk_pool_limit + 1);  // retires and drops every free segment
    pins.swap(pinned_);
    npinned_ = 0;
  }
  pins.clear();  // storages die outside the lock
  table().drop_unused();
  buffers_.clear();
}

static std::atomic<std::uint64_t>* pin_slot(const seg_mapping& m, std::uint32_t slot) {
  return static_cast<std::atomic<std::uint64_t>*>(static_cast<void*>(static_cast<char*>(m.base) + header_bytes)) + slot;
}

bool bulk_names::pin(const std::string& peer, std::shared_ptr<const void> keep, pin_ref& out) {
  std::vector<std::shared_ptr<const void>> released;  // dies after the lock (a storage's unlink may block)
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return false;
  if (!pin_segment_) {
    pin_segment_ = create_memfd_mapping(new_segment_name("pins_"), header_bytes + pin_slots * sizeof(std::uint64_t));
    if (!pin_segment_) return false;
    for (std::uint32_t i = pin_slots; i-- > 0;) free_slots_.push_back(i);
  }
  sweep_pins_locked(released);
  if (free_slots_.empty()) return false;
  out = pin_ref{pin_segment_, free_slots_.back(), new_ticket()};
  free_slots_.pop_back();
  pin_slot(*pin_segment_, out.slot)->store(out.ticket, std::memory_order_release);
  pinned_.push_back(pinned{peer, out.slot, out.ticket, std::move(keep)});
  npinned_ = pinned_.size();
  return true;
}

void bulk_names::sweep_pins() {
  if (npinned_.load(std::memory_order_relaxed) == 0) return;
  std::vector<std::shared_ptr<const void>> released;
  std::lock_guard<std::mutex> lock(mutex_);
  sweep_pins_locked(released);
}

// Caller holds mutex_. A slot that no longer holds its ticket was cleared by the receiver.
void bulk_names::sweep_pins_locked(std::vector<std::shared_ptr<const void>>& released) {
  std::erase_if(pinned_, [&](pinned& p) {
    if (pin_slot(*pin_segment_, p.slot)->load(std::memory_order_acquire) == p.ticket) return false;
    free_slots_.push_back(p.slot);
    released.push_back(std::move(p.keep));
    return true;
  });
  npinned_ = pinned_.size();
}

void bulk_names::disable_shared_memory() {
  std::lock_guard<std::mutex> lock(mutex_);
  enabled_ = false;
  reachable_.clear();
}

shm_probe bulk_names::probe() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!enabled_ || closed_) return {};
  if (!probe_) probe_ = create_memfd_mapping(new_segment_name("probe_"), header_bytes);
  if (!probe_) return {};
  return shm_probe{probe_->pid, probe_->owner_fd, probe_->name};
}

bool bulk_names::reachable(const std::string& peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = reachable_.find(peer);
  return enabled_ && it != reachable_.end() && it->second;
}

void bulk_names::set_reachable(const std::string& peer, bool ok) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (enabled_) reachable_[peer] = ok;
}

bool can_open_probe(const shm_probe& p) {
  if (p.pid <= 0 || p.fd < 0 || p.name.rfind(std::string(seg_prefix) + "probe_", 0) != 0) return false;
  try {
    ::close(open_peer_memfd(p.name, p.pid, p.fd));
    return true;
  } catch (const error&) {
    return false;
  }
}

void bulk_names::drop_peer(const std::string& peer) {
  ipc_.drop(peer);
  std::vector<std::shared_ptr<const void>> released;  // declared first: dies after the lock
  std::lock_guard<std::mutex> lock(mutex_);
  reachable_.erase(peer);
  std::erase_if(pinned_, [&](pinned& p) {
    if (p.peer != peer) return false;
    pin_slot(*pin_segment_, p.slot)->store(0, std::memory_order_release);
    free_slots_.push_back(p.slot);
    released.push_back(std::move(p.keep));
    return true;
  });
  npinned_ = pinned_.size();
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

bool same_host(const caf::node_id& a, const caf::node_id& b) {
  if (!a || !b) return false;
  const auto* x = dynamic_cast<const caf::node_id::default_data*>(&*a);
  const auto* y = dynamic_cast<const caf::node_id::default_data*>(&*b);
  return x && y && x->host_id() == y->host_id();
}

bool same_host_other_process(const caf::node_id& a, const caf::node_id& b) {
  if (!same_host(a, b)) return false;
  const auto* x = dynamic_cast<const caf::node_id::default_data*>(&*a);
  const auto* y = dynamic_cast<const caf::node_id::default_data*>(&*b);
  return x->process_id() != y->process_id();
}

}  // namespace troupe::detail
