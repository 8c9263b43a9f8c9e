// The hierarchical group: shared memory within a host, TCP between hosts
// (Note [hierarchical allreduce] in hierarchical_group.hpp).
#include "troupe/ddp/hierarchical_group.hpp"

#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "member_watch.hpp"
#include "troupe/actors/peer_events.hpp"
#include "troupe/actors/store.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "work_state.hpp"

namespace troupe::ddp {

namespace {

/// This machine: its host name and boot id (two namespaces of one kernel differ by host name).
std::string host_identity() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string boot;
  std::getline(in, boot);
  return std::string(host) + " " + boot;
}

/// Every rank's host index (hosts numbered by their lowest rank), after publishing this rank's.
std::vector<int> host_of_ranks(store_client& store, int rank, int world, const std::string& name,
                               std::chrono::milliseconds timeout) {
  const std::string prefix = "troupe/hg/" + name + "/host/";
  store.set(prefix + std::to_string(rank), host_identity());
  std::map<std::string, int> index;
  std::vector<int> host_of;
  for (int r = 0; r < world; ++r) {
    const auto id = store.get(prefix + std::to_string(r), timeout);
    host_of.push_back(index.emplace(id, static_cast<int>(index.size())).first->second);
  }
  return host_of;
}

std::string list(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

}  // namespace

struct hierarchical_group::impl {
  int rank;
  int world;
  std::string name;
  std::chrono::milliseconds step_timeout;
  std::vector<int> host_of;
  std::vector<int> mine;  // the ranks on this host
  int hosts = 0;
  std::unique_ptr<process_group> local;    // this host's ranks, shared memory
  std::unique_ptr<process_group> leaders;  // one rank per host, TCP; null on other ranks
  std::unique_ptr<process_group> flat;     // every rank, TCP
  std::string next_note;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<work::state>> queue;
  bool stopping = false;
  std::optional<troupe::error> broken;  // only the worker thread touches it
  std::uint64_t issued = 0;
  std::thread thread;
  std::optional<detail::member_watch> members;  // last: ends before the groups it breaks

  impl(store_client& store, int r, int w, std::string n, process_group_options opts)
      : rank(r), world(w), name(std::move(n)), step_timeout(opts.timeout + std::chrono::seconds(5)) {
    host_of = host_of_ranks(store, rank, world, name, opts.timeout);
    hosts = *std::max_element(host_of.begin(), host_of.end()) + 1;
    for (int q = 0; q < world; ++q)
      if (host_of[q] == host_of[rank]) mine.push_back(q);
    const int local_rank = static_cast<int>(std::find(mine.begin(), mine.end(), rank) - mine.begin());
    opts.watch_peers = false;  // watch_members breaks every part, naming the host
    auto local_opts = opts;
    local_opts.transport = transport_kind::shared_memory;
    local = std::make_unique<process_group>(store, local_rank, static_cast<int>(mine.size()),
                                            name + "-l" + std::to_string(host_of[rank]), local_opts);
    auto tcp_opts = opts;
    tcp_opts.transport = transport_kind::tcp;
    tcp_opts.shared_arena_bytes = 0;
    if (local_rank == 0) leaders = std::make_unique<process_group>(store, host_of[rank], hosts, name + "-x", tcp_opts);
    flat = std::make_unique<process_group>(store, rank, world, name + "-f", tcp_opts);
    if (store.peer_losses() && world > 1) watch_members(store, opts.timeout);
    thread = std::thread([this] { loop(); });
  }

  /// A lost member breaks every part, naming the member, its host and that host's ranks
  /// (Note [group peer loss], once for all parts).
  void watch_members(store_client& store, std::chrono::milliseconds timeout) {
    const detail::rendezvous rv{[&store](const std::string& k, const std::string& v) { store.set(k, v); },
                                [&store](const std::string& k, std::chrono::milliseconds t) { return store.get(k, t); }, nullptr,
                                store.peer_losses()};
    members.emplace(rv, "troupe/hg/" + name + "/worker/", rank, world, timeout, [this](int m, const peer_loss& l) {
      std::vector<int> same_host;
      for (int q = 0; q < world; ++q)
        if (host_of[q] == host_of[m]) same_host.push_back(q);
      break_all("rank " + std::to_string(m) + " (" + l.worker + ") on host " + std::to_string(host_of[m]) + " (ranks " +
                list(same_host) + ") was lost: " + l.reason);
    });
  }

  ~impl() {
    members.reset();
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    thread.join();
    for (auto& s : queue) s->finish(troupe::error(errc::invalid_state, s->description + ": the group was destroyed"));
  }

  void break_all(const std::string& reason) noexcept {
    local->break_group(reason);
    if (leaders) leaders->break_group(reason);
    flat->break_group(reason);
  }

  work submit(std::string what, std::function<void()> body, bool breaks = true) {
    auto s = std::make_shared<work::state>();
    s->breaks_group = breaks;
    {
      std::lock_guard<std::mutex> lock(mu);
      std::string note = std::move(next_note);
      next_note.clear();
      s->description = "hierarchical_group '" + name + "' rank " + std::to_string(rank) + ": " + what + " #" +
                       std::to_string(++issued) + (note.empty() ? "" : " (" + note + ")");
      if (!note.empty()) flat->note_next(note);
      s->body = std::move(body);
      queue.push_back(s);
    }
    cv.notify_one();
    return work(s);
  }

  void loop() {
    for (;;) {
      std::shared_ptr<work::state> s;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopping || !queue.empty(); });
        if (stopping) return;
        s = queue.front();
        queue.pop_front();
      }
      s->finish(run_one(*s));
    }
  }

  std::optional<troupe::error> run_one(work::state& s) {
    if (broken) return troupe::error(broken->code(), s.description + ": the group failed earlier: " + broken->message());
    try {
      s.body();
      return std::nullopt;
    } catch (const troupe::error& e) {
      // A mismatch is seen by every rank alike, a monitored barrier names the late ranks: the
      // group stays usable after both.
      if (e.code() == errc::collective_mismatch || !s.breaks_group) return e;
      fail(e);
      return troupe::error(e.code(), s.description + ": " + e.message());
    } catch (const std::exception& e) {
      fail(troupe::error(errc::invalid_state, e.what()));
      return broken;
    }
  }

  /// Breaks every part with `e`: the ranks waiting on this one in a part fail at once
  /// (Note [hierarchical allreduce]).
  void fail(const troupe::error& e) {
    broken = e;
    break_all(e.message());
  }

  void allreduce(tensor t, reduce_op op) {
    if (op == reduce_op::avg && !is_floating(t.dtype())) {
      flat->allreduce(t, op).wait(step_timeout);
      return;
    }
    const reduce_op inner = op == reduce_op::avg ? reduce_op::sum : op;
    if (mine.size() > 1) local->reduce(t, 0, inner).wait(step_timeout);
    if (leaders && hosts > 1) leaders->allreduce(t, inner).wait(step_timeout);
    if (mine.size() > 1) local->broadcast(t, 0).wait(step_timeout);
    if (op == reduce_op::avg && world > 1) {
      no_grad_guard guard;
      t.div_(static_cast<double>(world));
    }
  }
};

hierarchical_group::hierarchical_group(store_client& store, int rank, int world_size, std::string name, process_group_options opts) {
  if (rank < 0 || rank >= world_size)
    throw error(errc::bad_argument, "hierarchical_group: rank " + std::to_string(rank) + " outside [0, " +
                                        std::to_string(world_size) + ")");
  impl_ = std::make_unique<impl>(store, rank, world_size, std::move(name), std::move(opts));
}

hierarchical_group::~hierarchical_group() = default;
hierarchical_group::hierarchical_group(hierarchical_group&&) noexcept = default;
hierarchical_group& hierarchical_group::operator=(hierarchical_group&&) noexcept = default;

int hierarchical_group::rank() const noexcept { return impl_->rank; }
int hierarchical_group::world_size() const noexcept { return impl_->world; }
const std::string& hierarchical_group::name() const noexcept { return impl_->name; }
troupe::device hierarchical_group::device() const noexcept { return cpu_device; }
int hierarchical_group::hosts() const noexcept { return impl_->hosts; }
int hierarchical_group::host() const noexcept { return impl_->host_of[static_cast<std::size_t>(impl_->rank)]; }
const std::vector<int>& hierarchical_group::host_ranks() const noexcept { return impl_->mine; }
process_group& hierarchical_group::flat() { return *impl_->flat; }

namespace {
/// Throws at once what the flat group's checks throw for these arguments, without issuing.
void check_cpu(const char* op, const tensor& t) {
  if (!t.defined()) throw error(errc::bad_argument, std::string("hierarchical_group::") + op + ": undefined tensor");
  if (!t.is_cpu()) throw error(errc::device_mismatch, std::string("hierarchical_group::") + op + ": needs CPU tensors");
  if (!t.is_contiguous()) throw error(errc::bad_argument, std::string("hierarchical_group::") + op + ": tensor is not contiguous");
}
}  // namespace

work hierarchical_group::allreduce(tensor t, reduce_op op) {
  check_cpu("allreduce", t);
  auto* im = impl_.get();
  return impl_->submit("allreduce " + std::string(to_string(op)), [im, t, op] { im->allreduce(t, op); });
}

work hierarchical_group::broadcast(tensor t, int root) {
  check_cpu("broadcast", t);
  if (root < 0 || root >= world_size()) throw error(errc::bad_argument, "hierarchical_group::broadcast: root " + std::to_string(root) + " outside the group");
  auto* im = impl_.get();
  return impl_->submit("broadcast", [im, t, root] { im->flat->broadcast(t, root).wait(im->step_timeout); });
}

work hierarchical_group::allgather(tensor output, tensor input) {
  check_cpu("allgather", output);
  check_cpu("allgather", input);
  if (output.dtype() != input.dtype() || output.numel() != input.numel() * world_size())
    throw error(errc::shape_mismatch, "hierarchical_group::allgather: output must hold world_size x input");
  auto* im = impl_.get();
  return impl_->submit("allgather", [im, output, input] { im->flat->allgather(output, input).wait(im->step_timeout); });
}

work hierarchical_group::reduce_scatter(tensor output, tensor input, reduce_op op) {
  check_cpu("reduce_scatter", output);
  check_cpu("reduce_scatter", input);
  if (output.dtype() != input.dtype() || input.numel() != output.numel() * world_size())
    throw error(errc::shape_mismatch, "hierarchical_group::reduce_scatter: input must hold world_size x output");
  auto* im = impl_.get();
  return impl_->submit("reduce_scatter", [im, output, input, op] { im->flat->reduce_scatter(output, input, op).wait(im->step_timeout); });
}

work hierarchical_group::barrier() {
  auto* im = impl_.get();
  return impl_->submit("barrier", [im] { im->flat->barrier().wait(im->step_timeout); });
}

void hierarchical_group::monitored_barrier(std::chrono::milliseconds timeout) {
  auto* im = impl_.get();
  // In issue order: after every collective queued before it.
  impl_->submit("monitored_barrier", [im, timeout] { im->flat->monitored_barrier(timeout); }, false).wait(impl_->step_timeout + timeout);
}

tensor hierarchical_group::make_buffer(shape_t shape, troupe::dtype dt) { return impl_->local->make_buffer(std::move(shape), dt); }

void hierarchical_group::note_next(std::string note) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->next_note = std::move(note);
}

std::unique_ptr<collective_group> make_cpu_group(store_client& store, int rank, int world_size, std::string name,
                                                 process_group_options opts) {
  if (opts.transport == transport_kind::automatic && rank >= 0 && rank < world_size) {
    const auto host_of = host_of_ranks(store, rank, world_size, name, opts.timeout);
    const int hosts = *std::max_element(host_of.begin(), host_of.end()) + 1;
    if (hosts > 1 && hosts < world_size) return std::make_unique<hierarchical_group>(store, rank, world_size, std::move(name), std::move(opts));
  }
  return std::make_unique<process_group>(store, rank, world_size, std::move(name), std::move(opts));
}

}  // namespace troupe::ddp
