// The shared-memory transport of the CPU process group. See Note [shm collectives].
#include "shm_transport.hpp"

#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstring>
#include <new>
#include <random>
#include <sstream>
#include <thread>

#include "troupe/tensors/dtype.hpp"

namespace troupe::ddp::detail {

namespace {

using clock = std::chrono::steady_clock;

bool reached(std::uint32_t value, std::uint32_t target) noexcept {
  return static_cast<std::int32_t>(value - target) >= 0;
}

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t seen, long nanos) noexcept {
  timespec ts{0, nanos};
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake(std::atomic<std::uint32_t>& word) noexcept {
  ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

std::string sanitize(const std::string& name) {
  if (name.empty() || name.size() > 64)
    throw error(errc::bad_argument, "process_group: the group name must be 1-64 characters, got '" + name + "'");
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'))
      throw error(errc::bad_argument, "process_group: the group name '" + name + "' may hold only letters, digits, '-' and '_'");
  return name;
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace


const char* to_string(collective_kind k) noexcept {
  switch (k) {
    case collective_kind::allreduce: return "allreduce";
    case collective_kind::broadcast: return "broadcast";
    case collective_kind::allgather: return "allgather";
    case collective_kind::reduce_scatter: return "reduce_scatter";
    case collective_kind::barrier: return "barrier";
    case collective_kind::reduce: return "reduce";
    case collective_kind::gather: return "gather";
    case collective_kind::scatter: return "scatter";
    case collective_kind::all_to_all: return "all_to_all";
  }
  return "unknown";
}

std::string describe(const fingerprint& f) {
  std::ostringstream os;
  os << to_string(static_cast<collective_kind>(f.kind));
  const auto kind = static_cast<collective_kind>(f.kind);
  if (kind == collective_kind::allreduce || kind == collective_kind::reduce_scatter)
    os << "(" << to_string(static_cast<reduce_op>(f.op)) << ")";
  if (kind == collective_kind::reduce) os << "(" << to_string(static_cast<reduce_op>(f.op)) << ", root " << f.root << ")";
  if (kind == collective_kind::broadcast || kind == collective_kind::gather || kind == collective_kind::scatter)
    os << "(root " << f.root << ")";
  if (kind != collective_kind::barrier)
    os << " " << troupe::to_string(static_cast<troupe::dtype>(f.dtype)) << " numel " << f.numel;
  os << " #" << f.seq;
  return os.str();
}

shm_transport::shm_transport(const rendezvous& store, int rank, int world, const std::string& name,
                             const process_group_options& opts)
    : rank_(rank), world_(world), name_(sanitize(name)), slot_bytes_(opts.slot_bytes), p2p_bytes_(opts.p2p_bytes),
      timeout_(opts.timeout) {
  if (world < 1 || world > max_ranks || rank < 0 || rank >= world)
    throw error(errc::bad_argument, "process_group '" + name + "': rank " + std::to_string(rank) +
                                        " / world size " + std::to_string(world) + " out of range (world 1.." +
                                        std::to_string(max_ranks) + ")");
  if (slot_bytes_ < 4096 || slot_bytes_ % 64 != 0 || p2p_bytes_ < 4096 || p2p_bytes_ % 64 != 0)
    throw error(errc::bad_argument, "process_group: slot_bytes and p2p_bytes must be multiples of 64, >= 4096");
  const std::size_t total = control_bytes + 2 * slot_bytes_ + static_cast<std::size_t>(world) * p2p_bytes_;
  std::random_device rd;
  const std::string own = "/troupe_pg_" + name_ + "_" + std::to_string(rank) + "_" + std::to_string(::getpid()) +
                          "_" + std::to_string(rd());
  segments_.resize(static_cast<std::size_t>(world));
  segments_[rank] = shm_segment::create_named(total, own);
  auto* cb = new (segments_[rank].data()) control_block();
  cb->pid = ::getpid();
  const std::string prefix = "troupe/pg/" + name_ + "/";
  const std::string own_arena = own + "_arena";
  if (opts.shared_arena_bytes > 0)
    arena_ = std::make_shared<shm_arena>(sparse_mapping::create(own_arena, opts.shared_arena_bytes));
  store.set(prefix + std::to_string(rank), own + " " + std::to_string(cb->pid) + " " + (arena_ ? own_arena : "-") + " " +
                                               std::to_string(opts.shared_arena_bytes));
  try {
    map_peers(store, prefix, total);
    store.barrier(prefix + "mapped", rank, world, timeout_);
  } catch (...) {
    if (arena_) ::shm_unlink(own_arena.c_str());
    throw;
  }
  ::shm_unlink(own.c_str());  // every rank mapped both: nothing is left behind if we die
  if (arena_) ::shm_unlink(own_arena.c_str());
}

void shm_transport::map_peers(const rendezvous& store, const std::string& prefix, std::size_t total) {
  pids_.assign(static_cast<std::size_t>(world_), 0);
  pidfds_.assign(static_cast<std::size_t>(world_), -1);
  peer_arenas_.resize(static_cast<std::size_t>(world_));
  arena_bases_.assign(static_cast<std::size_t>(world_), nullptr);
  for (int r = 0; r < world_; ++r) {
    std::istringstream in(store.get(prefix + std::to_string(r), timeout_));
    std::string seg, arena;
    std::size_t arena_bytes = 0;
    in >> seg >> pids_[r] >> arena >> arena_bytes;
    if (r != rank_) segments_[r] = shm_segment::open_named(seg, total);
    if (r != rank_ && arena != "-") peer_arenas_[r] = sparse_mapping::open(arena, arena_bytes);
    arena_bases_[r] = r == rank_ ? (arena_ ? arena_->base() : nullptr) : peer_arenas_[r].data();
    pidfds_[r] = static_cast<int>(::syscall(SYS_pidfd_open, pids_[r], 0));
  }
}

shm_transport::~shm_transport() {
  auto& cb = ctl(rank_);
  cb.left.store(1, std::memory_order_release);
  for (auto& c : cb.counters) futex_wake(c.v);
  for (int fd : pidfds_)
    if (fd >= 0) ::close(fd);
}

std::byte* shm_transport::slot(int r, std::uint32_t chunk) const noexcept {
  return static_cast<std::byte*>(segments_[r].data()) + control_bytes + (chunk % 2) * slot_bytes_;
}

std::byte* shm_transport::mailbox(int owner, int dst) const noexcept {
  return static_cast<std::byte*>(segments_[owner].data()) + control_bytes + 2 * slot_bytes_ +
         static_cast<std::size_t>(dst) * p2p_bytes_;
}

void shm_transport::begin(lane l, std::string what) {
  auto& op = ops_[static_cast<int>(l)];
  op.what = std::move(what);
  op.next_check = clock::now();
  op.deadline = op.next_check + timeout_;
}

void shm_transport::publish(std::atomic<std::uint32_t>& c, std::uint32_t value) {
  c.store(value, std::memory_order_release);
  futex_wake(c);
}

void shm_transport::peer_lost(const std::string& reason) noexcept {
  std::lock_guard<std::mutex> lock(lost_mu_);
  if (lost_.load(std::memory_order_acquire)) return;
  lost_reason_ = reason;
  lost_.store(true, std::memory_order_release);
}

void shm_transport::check_peer(int r, const lane_operation& op) {
  if (lost_.load(std::memory_order_acquire)) {  // Note [group peer loss]
    std::lock_guard<std::mutex> lock(lost_mu_);
    throw error(errc::peer_lost, "process_group '" + name_ + "': during " + op.what + ", " + lost_reason_);
  }
  // Only the peer being waited on matters: a rank that finished its part and exited is fine.
  // A peer that aborted passes on what it saw (its reason names the rank that died first).
  const auto& cb = ctl(r);
  if (cb.aborted.load(std::memory_order_acquire) != 0)
    throw error(errc::peer_lost, "process_group '" + name_ + "': during " + op.what + ", rank " + std::to_string(r) +
                                     " aborted: " + std::string(cb.reason));
  if (cb.left.load(std::memory_order_acquire) != 0) {
    const std::uint32_t last = cb.counters[fp_seq].v.load(std::memory_order_acquire);
    const std::string after = last == 0 ? "before entering any collective"
                                        : "after collective #" + std::to_string(last) + " (" + describe(cb.fp[last % 2]) + ")";
    throw error(errc::collective_mismatch, "process_group '" + name_ + "': rank " + std::to_string(r) +
                                               " left the group " + after + " while rank " + std::to_string(rank_) +
                                               " waits for it in " + op.what +
                                               ": the ranks issued different numbers of collectives (did a rank skip one?)");
  }
  bool gone = false;
  if (pidfds_[r] >= 0) {
    pollfd p{pidfds_[r], POLLIN, 0};
    gone = ::poll(&p, 1, 0) == 1;
  } else {
    gone = ::kill(pids_[r], 0) != 0 && errno == ESRCH;
  }
  if (gone)
    throw error(errc::peer_lost, "process_group '" + name_ + "': rank " + std::to_string(r) + " (pid " +
                                     std::to_string(pids_[r]) + ") died during " + op.what);
}

void shm_transport::wait_ge(int r, std::atomic<std::uint32_t>& c, std::uint32_t target, lane l) {
  for (int i = 0; i < 4000; ++i) {
    if (reached(c.load(std::memory_order_acquire), target)) return;
    cpu_relax();
  }
  for (;;) {
    const std::uint32_t seen = c.load(std::memory_order_acquire);
    if (reached(seen, target)) return;
    const auto now = clock::now();
    auto& op = ops_[static_cast<int>(l)];
    if (now >= op.next_check) {
      try {
        check_peer(r, op);
      } catch (const error&) {
        if (reached(c.load(std::memory_order_acquire), target)) return;  // published, then went
        throw;
      }
      if (now >= op.deadline) fail_timeout({r}, op);
      op.next_check = now + std::chrono::milliseconds(5);
    }
    futex_wait(c, seen, 1'000'000);
  }
}

void shm_transport::wait_all(counter c, std::uint32_t target) {
  for (int r = 0; r < world_; ++r)
    if (r != rank_) wait_ge(r, ctl(r).counters[c].v, target);
}

void shm_transport::fail_timeout(const std::vector<int>& missing, const lane_operation& op) {
  throw error(errc::timeout, "process_group '" + name_ + "': " + op.what + " timed out after " +
                                 std::to_string(timeout_.count()) + " ms waiting for rank(s) " + join_ranks(missing));
}

std::byte* shm_transport::peer_data(int r, std::uint32_t seq) const noexcept {
  const std::uint64_t off = ctl(r).data_off[seq % 2];
  return off == 0 || arena_bases_[r] == nullptr ? nullptr : arena_bases_[r] + (off - 1);
}

void shm_transport::enter(fingerprint f, std::uint64_t data_off) {
  auto& mine = ctl(rank_);
  mine.fp[f.seq % 2] = f;
  mine.data_off[f.seq % 2] = data_off;
  publish(fp_seq, f.seq);
  wait_all(fp_seq, f.seq);
  std::vector<fingerprint> all(static_cast<std::size_t>(world_));
  for (int r = 0; r < world_; ++r) all[r] = ctl(r).fp[f.seq % 2];
  for (int r = 1; r < world_; ++r) {
    const auto& a = all[0];
    const auto& b = all[r];
    if (a.kind == b.kind && a.op == b.op && a.dtype == b.dtype && a.numel == b.numel && a.root == b.root) continue;
    throw error(errc::collective_mismatch, "process_group '" + name_ + "': collective #" + std::to_string(f.seq) +
                                               " differs across ranks: rank 0 called " + describe(a) + ", rank " +
                                               std::to_string(r) + " called " + describe(b));
  }
}

void shm_transport::enter_monitored(fingerprint f, std::chrono::milliseconds timeout) {
  ctl(rank_).fp[f.seq % 2] = f;
  ctl(rank_).data_off[f.seq % 2] = 0;
  publish(fp_seq, f.seq);
  const auto deadline = clock::now() + timeout;
  for (;;) {
    std::vector<int> missing;
    for (int r = 0; r < world_; ++r)
      if (!reached(ctl(r).counters[fp_seq].v.load(std::memory_order_acquire), f.seq)) missing.push_back(r);
    if (missing.empty()) return;
    for (int r : missing) check_peer(r, ops_[static_cast<int>(lane::collectives)]);
    if (clock::now() >= deadline)
      throw error(errc::timeout, "process_group '" + name_ + "': monitored barrier #" + std::to_string(f.seq) +
                                     ": rank(s) " + join_ranks(missing) + " did not arrive within " +
                                     std::to_string(timeout.count()) + " ms");
    futex_wait(ctl(missing.front()).counters[fp_seq].v, ctl(missing.front()).counters[fp_seq].v.load(), 1'000'000);
  }
}

void shm_transport::abort(const std::string& reason) noexcept {
  auto& cb = ctl(rank_);
  std::strncpy(cb.reason, reason.c_str(), sizeof(cb.reason) - 1);
  cb.aborted.store(1, std::memory_order_release);
  for (auto& c : cb.counters) futex_wake(c.v);
}

}  // namespace troupe::ddp::detail
