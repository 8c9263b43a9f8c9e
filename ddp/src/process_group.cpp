// The process group: argument checks on the calling thread, a worker thread running the
// collectives in issue order over the shared-memory transport, and the work handles.
#include "troupe/ddp/process_group.hpp"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "collective_watch.hpp"
#include "collectives.hpp"
#include "composed_collectives.hpp"
#include "member_watch.hpp"
#include "payload_faults.hpp"
#include "shm_transport.hpp"
#include "tcp_transport.hpp"
#include "troupe/actors/store.hpp"
#include "troupe/ddp/file_store.hpp"
#include "troupe/tensors/factories.hpp"
#include "work_state.hpp"

namespace troupe::ddp {

const char* to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::avg: return "avg";
    case reduce_op::min: return "min";
    case reduce_op::max: return "max";
    case reduce_op::product: return "product";
  }
  return "unknown";
}

struct process_group::impl {
  // Exactly one transport is set (Note [shm collectives] or Note [tcp ring]).
  std::unique_ptr<detail::shm_transport> shm;
  std::unique_ptr<detail::tcp_transport> tcp;
  int rank;
  int world;
  std::string name;
  detail::p2p_counters p2p;
  /// One worker thread with its queue. Collectives, sends and receives each get their own, so
  /// a large send waiting for its receiver never blocks the receive that would unblock a peer.
  struct lane {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::shared_ptr<work::state>> queue;
    bool stopping = false;
    std::thread thread;
  };
  enum lane_id {
    collectives = static_cast<int>(detail::lane::collectives),
    sends = static_cast<int>(detail::lane::sends),
    recvs = static_cast<int>(detail::lane::receives)
  };
  lane lanes[detail::lane_count];
  std::mutex broken_mu;
  std::optional<troupe::error> broken;
  std::mutex issue_mu;      // a sequence number and its queue position go together
  std::uint32_t issued = 0;  // sequence numbers of group collectives
  std::uint32_t subgroups = 0;  // new_group calls so far (names the next subgroup)
  std::uint32_t sends_made = 0;  // send lane only: numbers the sends for payload faults
  std::string next_note;        // note_next(); taken by the next issue()
  std::function<void(const std::string&, std::int64_t)> fault_points;  // process_group_options::fault_points
  std::unique_ptr<detail::collective_watch> watch;  // Note [hang blame]
  std::unique_ptr<detail::payload_faults> faults;   // Note [collective payload faults]; null without a hook
  std::shared_ptr<flight_recorder> recorder;        // process_group_options::recorder (repeats are recorded)
  // Note [group peer loss]; declared last, so it ends before anything its listener touches.
  std::optional<detail::member_watch> members;

  impl(const detail::rendezvous& store, int rank, int world, std::string n, const process_group_options& opts)
      : rank(rank), world(world), name(std::move(n)) {
    fault_points = opts.fault_points;
    if (opts.payload_faults) faults = std::make_unique<detail::payload_faults>(opts.payload_faults, name, rank);
    recorder = opts.recorder;
    if (detail::choose_transport(store, rank, world, name, opts.transport, opts.timeout) == transport_kind::tcp)
      tcp = std::make_unique<detail::tcp_transport>(store, rank, world, name, opts);
    else
      shm = std::make_unique<detail::shm_transport>(store, rank, world, name, opts);
    watch = std::make_unique<detail::collective_watch>(detail::watch_store{store.set, store.get}, name, rank, world, opts.recorder,
                                                       opts.blame_after, opts.on_blame);
    if (store.events && world > 1 && opts.watch_peers)
      members.emplace(store, "troupe/pg/" + name + "/worker/", rank, world, opts.timeout,
                      [this](int m, const peer_loss& l) {
                        const std::string why = detail::member_watch::describe(m, l);
                        if (faults) faults->stop();  // a delayed payload goes at once, to fail
                        visit([&](auto& tp) { tp.peer_lost(why); });
                      });
    p2p.sent.assign(static_cast<std::size_t>(world), 0);
    p2p.received.assign(static_cast<std::size_t>(world), 0);
    for (auto& l : lanes) l.thread = std::thread([this, &l] { loop(l); });
  }

  /// Calls fn(transport) with the group's transport.
  template <class Fn>
  void visit(Fn&& fn) {
    if (shm) fn(*shm);
    else fn(*tcp);
  }

  ~impl() {
    if (faults) faults->stop();
    for (auto& l : lanes) {
      {
        std::lock_guard<std::mutex> lock(l.mu);
        l.stopping = true;
      }
      l.cv.notify_all();
      l.thread.join();
      for (auto& s : l.queue)
        s->finish(troupe::error(errc::invalid_state, s->description + ": the process group was destroyed"));
    }
  }

  work submit(std::string description, std::function<void()> body, lane_id id = collectives, bool breaks = true) {
    auto s = std::make_shared<work::state>();
    s->description = "process_group '" + name + "' rank " + std::to_string(rank) + ": " + description;
    s->body = std::move(body);
    s->breaks_group = breaks;
    lane& l = lanes[id];
    {
      std::lock_guard<std::mutex> lock(l.mu);
      l.queue.push_back(s);
    }
    l.cv.notify_one();
    return work(s);
  }

  void loop(lane& l) {
    for (;;) {
      std::shared_ptr<work::state> s;
      {
        std::unique_lock<std::mutex> lock(l.mu);
        l.cv.wait(lock, [&] { return l.stopping || !l.queue.empty(); });
        if (l.stopping) return;
        s = l.queue.front();
        l.queue.pop_front();
      }
      s->finish(run_one(*s, static_cast<detail::lane>(&l - lanes)));
    }
  }

  std::optional<troupe::error> run_one(work::state& s, detail::lane on) {
    {
      std::lock_guard<std::mutex> lock(broken_mu);
      if (broken)
        return troupe::error(broken->code(), s.description + ": the group failed earlier: " + broken->message());
    }
    try {
      visit([&](auto& tp) { tp.begin(on, s.description); });
      s.body();
      return std::nullopt;
    } catch (const troupe::error& e) {
      // A mismatch was seen by every rank alike, a monitored barrier names the late ranks: the
      // group stays usable after both.
      if (e.code() == errc::collective_mismatch || !s.breaks_group) return e;
      return fail(e);
    } catch (const std::exception& e) {
      return fail(troupe::error(errc::invalid_state, e.what()));
    }
  }

  /// Takes the next sequence number and queues `body(transport, seq)` as collective `what #seq`.
  template <class Body>
  work issue(const std::string& what, const std::string& detail, Body body) {
    std::lock_guard<std::mutex> lock(issue_mu);
    const std::uint32_t seq = ++issued;
    std::string note = std::move(next_note);
    next_note.clear();
    return submit(what + " #" + std::to_string(seq) + (note.empty() ? "" : " (" + note + ")") + detail,
                  [this, seq, body, what, note, detail] {
                    // Note [collective payload faults]: a delayed rank has not entered yet.
                    using fate = detail::payload_faults::fate;
                    const fate f = faults ? faults->apply(what, seq, note) : fate::deliver;
                    watch->run(what, seq, note, detail, [&] {  // Note [hang blame]
                      if (f == fate::drop) throw faults->dropped(what, seq);
                      visit([&](auto& tp) { body(tp, seq); });
                    });
                    if (faults) after_payload(f == fate::repeat, what, seq, [&](auto& tp) { tp.repeat_entry(); });
                  });
  }

  /// Note [collective payload faults]: sends a repeated payload again (`repeat(transport)`) and
  /// records it, and records the repeats this rank dropped on arrival. Only with a hook.
  template <class Repeat>
  void after_payload(bool repeated, const std::string& what, std::uint32_t seq, Repeat repeat) {
    if (repeated) {
      visit(repeat);
      if (recorder) recorder->end(recorder->begin(trace_kind::collective, what + " repeat", seq, "fault plan: sent twice"));
    }
    std::uint64_t dropped = 0;
    visit([&](auto& tp) { dropped = tp.take_repeats(); });
    if (dropped > 0 && recorder)
      recorder->end(recorder->begin(trace_kind::collective, "repeat discarded", seq, std::to_string(dropped) + " on arrival"));
  }

  troupe::error fail(const troupe::error& e) {
    std::lock_guard<std::mutex> lock(broken_mu);
    if (!broken) {
      broken = e;
      if (faults) faults->stop();
      visit([&](auto& tp) { tp.abort(e.message()); });
    }
    return e;
  }
};

namespace {

void check_tensor(const char* op, const tensor& t) {
  if (!t.defined()) throw error(errc::bad_argument, std::string("process_group::") + op + ": undefined tensor");
  if (!t.is_cpu())
    throw error(errc::device_mismatch, std::string("process_group::") + op +
                                           ": the CPU backend needs CPU tensors, got one on " + troupe::to_string(t.device()));
  if (!t.is_contiguous())
    throw error(errc::bad_argument, std::string("process_group::") + op + ": tensor of shape " +
                                        shape_to_string(t.shape()) + " is not contiguous");
}

void check_rank(const char* op, int r, int world) {
  if (r < 0 || r >= world)
    throw error(errc::bad_argument, std::string("process_group::") + op + ": rank " + std::to_string(r) +
                                        " outside [0, " + std::to_string(world) + ")");
}

std::string typed(const tensor& t) {
  std::string s(" ");
  s += troupe::to_string(t.dtype());
  s += shape_to_string(t.shape());
  return s;
}

/// Throws shape_mismatch unless `whole` holds `world` blocks of `block` (same dtype).
void check_blocks(const char* op, const char* whole_name, const tensor& whole, const char* block_name, const tensor& block,
                  int world) {
  if (whole.dtype() == block.dtype() && whole.numel() == block.numel() * world) return;
  throw error(errc::shape_mismatch, std::string("process_group::") + op + ": " + whole_name + typed(whole) +
                                        " must hold world_size (" + std::to_string(world) + ") x " + block_name + typed(block));
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (int x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(x);
  }
  return "{" + s + "}";
}

}  // namespace

process_group::process_group(store_client& store, int rank, int world_size, std::string name,
                             process_group_options opts) {
  detail::rendezvous rv{[&store](const std::string& k, const std::string& v) { store.set(k, v); },
                        [&store](const std::string& k, std::chrono::milliseconds t) { return store.get(k, t); },
                        [&store](const std::string& n, int r, int w, std::chrono::milliseconds t) { store.barrier(n, r, w, t); },
                        store.peer_losses()};
  impl_ = std::make_unique<impl>(rv, rank, world_size, std::move(name), opts);
}

process_group::process_group(const file_store& store, int rank, int world_size, std::string name,
                             process_group_options opts) {
  detail::rendezvous rv{[store](const std::string& k, const std::string& v) { store.set(k, v); },
                        [store](const std::string& k, std::chrono::milliseconds t) { return store.get(k, t); },
                        [store](const std::string& n, int r, int w, std::chrono::milliseconds t) { store.barrier(n, r, w, t); },
                        nullptr};
  impl_ = std::make_unique<impl>(rv, rank, world_size, std::move(name), opts);
}
process_group::~process_group() = default;
process_group::process_group(process_group&&) noexcept = default;
process_group& process_group::operator=(process_group&&) noexcept = default;

int process_group::rank() const noexcept { return impl_->rank; }
int process_group::world_size() const noexcept { return impl_->world; }
const std::string& process_group::name() const noexcept { return impl_->name; }

work process_group::allreduce(tensor t, reduce_op op) {
  check_tensor("allreduce", t);
  return impl_->issue("allreduce", typed(t) + " " + to_string(op),
                      [t, op](auto& tp, std::uint32_t seq) { detail::run_allreduce(tp, seq, t, op); });
}

work process_group::broadcast(tensor t, int root) {
  check_tensor("broadcast", t);
  check_rank("broadcast", root, world_size());
  return impl_->issue("broadcast", typed(t) + " from " + std::to_string(root),
                      [t, root](auto& tp, std::uint32_t seq) { detail::run_broadcast(tp, seq, t, root); });
}

work process_group::allgather(tensor output, tensor input) {
  check_tensor("allgather", output);
  check_tensor("allgather", input);
  check_blocks("allgather", "output", output, "input", input, world_size());
  return impl_->issue("allgather", typed(input),
                      [output, input](auto& tp, std::uint32_t seq) { detail::run_allgather(tp, seq, output, input); });
}

work process_group::reduce_scatter(tensor output, tensor input, reduce_op op) {
  check_tensor("reduce_scatter", output);
  check_tensor("reduce_scatter", input);
  check_blocks("reduce_scatter", "input", input, "output", output, world_size());
  return impl_->issue("reduce_scatter", typed(output) + " " + to_string(op), [output, input, op](auto& tp, std::uint32_t seq) {
    detail::run_reduce_scatter(tp, seq, output, input, op);
  });
}

work process_group::reduce(tensor t, int root, reduce_op op) {
  check_tensor("reduce", t);
  check_rank("reduce", root, world_size());
  return impl_->issue("reduce", typed(t) + " " + to_string(op) + " to " + std::to_string(root),
                      [t, root, op](auto& tp, std::uint32_t seq) { detail::run_reduce(tp, seq, t, root, op); });
}

work process_group::gather(tensor output, tensor input, int root) {
  check_tensor("gather", input);
  check_rank("gather", root, world_size());
  if (rank() == root) {
    check_tensor("gather", output);
    check_blocks("gather", "output", output, "input", input, world_size());
  }
  return impl_->issue("gather", typed(input) + " to " + std::to_string(root),
                      [output, input, root](auto& tp, std::uint32_t seq) { detail::run_gather(tp, seq, output, input, root); });
}

work process_group::scatter(tensor output, tensor input, int root) {
  check_tensor("scatter", output);
  check_rank("scatter", root, world_size());
  if (rank() == root) {
    check_tensor("scatter", input);
    check_blocks("scatter", "input", input, "output", output, world_size());
  }
  return impl_->issue("scatter", typed(output) + " from " + std::to_string(root),
                      [output, input, root](auto& tp, std::uint32_t seq) { detail::run_scatter(tp, seq, output, input, root); });
}

work process_group::all_to_all(tensor output, tensor input) {
  check_tensor("all_to_all", output);
  check_tensor("all_to_all", input);
  const int w = world_size();
  if (output.dtype() != input.dtype() || output.numel() != input.numel() || input.numel() % w != 0)
    throw error(errc::shape_mismatch, "process_group::all_to_all: input" + typed(input) + " and output" + typed(output) +
                                          " must have the same dtype and size, a multiple of world_size (" +
                                          std::to_string(w) + ")");
  return impl_->issue("all_to_all", typed(input),
                      [output, input](auto& tp, std::uint32_t seq) { detail::run_all_to_all(tp, seq, output, input); });
}

void process_group::fault_point(const std::string& point, std::int64_t step) {
  if (impl_->fault_points) impl_->fault_points(point, step);
}

void process_group::note_next(std::string note) {
  std::lock_guard<std::mutex> lock(impl_->issue_mu);
  impl_->next_note = std::move(note);
}

work process_group::barrier() {
  return impl_->issue("barrier", "", [](auto& tp, std::uint32_t seq) { detail::run_barrier(tp, seq); });
}

void process_group::monitored_barrier(std::chrono::milliseconds timeout) {
  work w;
  {
    std::lock_guard<std::mutex> issue(impl_->issue_mu);
    const std::uint32_t seq = ++impl_->issued;
    auto* im = impl_.get();
    detail::fingerprint f;
    f.seq = seq;
    f.kind = static_cast<std::uint8_t>(detail::collective_kind::barrier);
    w = impl_->submit("monitored_barrier #" + std::to_string(seq), [im, f, timeout] { im->visit([&](auto& tp) { tp.enter_monitored(f, timeout); }); },
                      impl::collectives, false);
  }
  w.wait(timeout + std::chrono::seconds(5));
}

void process_group::break_group(const std::string& reason) noexcept {
  impl_->visit([&](auto& tp) { tp.peer_lost(reason); });  // wakes a running collective
  try {
    // On the worker, after whatever runs: breaks the group and aborts the transport, which
    // tells the peers waiting on this rank (a group failed earlier ignores it).
    impl_->submit("break_group", [reason] { throw troupe::error(errc::peer_lost, reason); });
  } catch (...) {
  }
}

work process_group::send(tensor t, int dst, int tag) {
  check_tensor("send", t);
  check_rank("send", dst, world_size());
  if (dst == rank()) throw error(errc::bad_argument, "process_group::send: a rank cannot send to itself");
  auto* im = impl_.get();
  return impl_->submit("send " + std::string(troupe::to_string(t.dtype())) + shape_to_string(t.shape()) + " to " +
                           std::to_string(dst),
                       [im, t, dst, tag] {
                         // Note [collective payload faults]: sends are numbered by their order on this rank.
                         using fate = detail::payload_faults::fate;
                         const fate f = im->faults ? im->faults->apply("send", ++im->sends_made, "") : fate::deliver;
                         if (f == fate::drop) {  // the matching recv fails at once, naming the drop
                           const troupe::error e = im->faults->dropped("send", im->sends_made);
                           im->visit([&](auto& tp) { tp.p2p_abort(dst, e.message()); });
                           throw e;
                         }
                         im->visit([&](auto& tp) { detail::run_send(tp, im->p2p, t, dst, tag); });
                         if (im->faults)
                           im->after_payload(f == fate::repeat, "send", im->sends_made,
                                             [&](auto& tp) { tp.repeat_send(dst, static_cast<const std::byte*>(t.data_ptr()), t.nbytes()); });
                       },
                       impl::sends);
}

work process_group::recv(tensor t, int src, int tag) {
  check_tensor("recv", t);
  check_rank("recv", src, world_size());
  if (src == rank()) throw error(errc::bad_argument, "process_group::recv: a rank cannot receive from itself");
  auto* im = impl_.get();
  return impl_->submit("recv " + std::string(troupe::to_string(t.dtype())) + shape_to_string(t.shape()) + " from " +
                           std::to_string(src),
                       [im, t, src, tag] {
                         im->visit([&](auto& tp) { detail::run_recv(tp, im->p2p, t, src, tag); });
                         if (im->faults) im->after_payload(false, "recv", 0, [](auto&) {});
                       },
                       impl::recvs);
}

tensor process_group::empty_shared(shape_t shape, troupe::dtype dt) {
  for (auto d : shape)
    if (d < 0) throw error(errc::bad_argument, "process_group::empty_shared: negative size in shape " + shape_to_string(shape));
  if (impl_->shm && impl_->shm->arena()) {
    tensor t = impl_->shm->arena()->allocate(shape, dt);
    if (t.defined()) return t;
  }
  return zeros(std::move(shape), {dt});
}

namespace {

/// Validates and sorts `ranks`, checks through `pg` that every rank passed the same list, and
/// returns this rank's index in it (-1: not a member) and the subgroup's name.
std::pair<int, std::string> agree_on_members(process_group& pg, std::uint32_t k, std::vector<int>& ranks,
                                             std::chrono::milliseconds timeout) {
  const int w = pg.world_size();
  if (ranks.empty()) throw error(errc::bad_argument, "process_group::new_group: empty rank list");
  std::sort(ranks.begin(), ranks.end());
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    check_rank("new_group", ranks[i], w);
    if (i > 0 && ranks[i] == ranks[i - 1])
      throw error(errc::bad_argument, "process_group::new_group: rank " + std::to_string(ranks[i]) + " listed twice");
  }
  tensor mine = full({w}, -1.0, {dtype::int32});
  for (std::size_t i = 0; i < ranks.size(); ++i) mine.data<std::int32_t>()[i] = ranks[i];
  tensor all = zeros({static_cast<std::int64_t>(w) * w}, {dtype::int32});
  pg.allgather(all, mine).wait(timeout + std::chrono::seconds(5));
  auto list_of = [&](int r) {
    std::vector<int> v;
    for (int i = 0; i < w && all.data<std::int32_t>()[r * w + i] >= 0; ++i) v.push_back(all.data<std::int32_t>()[r * w + i]);
    return v;
  };
  for (int r = 1; r < w; ++r)
    if (list_of(r) != list_of(0))
      throw error(errc::collective_mismatch, "process_group '" + pg.name() + "': new_group #" + std::to_string(k) +
                                                 ": rank 0 asked for ranks " + join(list_of(0)) + ", rank " +
                                                 std::to_string(r) + " for " + join(list_of(r)));
  const auto at = std::find(ranks.begin(), ranks.end(), pg.rank());
  return {at == ranks.end() ? -1 : static_cast<int>(at - ranks.begin()), pg.name() + "-g" + std::to_string(k)};
}

}  // namespace

std::optional<process_group> process_group::new_group(store_client& store, std::vector<int> ranks, process_group_options opts) {
  const auto [index, sub] = agree_on_members(*this, ++impl_->subgroups, ranks, opts.timeout);
  if (index < 0) return std::nullopt;
  return process_group(store, index, static_cast<int>(ranks.size()), sub, opts);
}

std::optional<process_group> process_group::new_group(const file_store& store, std::vector<int> ranks,
                                                      process_group_options opts) {
  const auto [index, sub] = agree_on_members(*this, ++impl_->subgroups, ranks, opts.timeout);
  if (index < 0) return std::nullopt;
  return process_group(store, index, static_cast<int>(ranks.size()), sub, opts);
}

bool process_group::is_shared(const tensor& t) const {
  if (!t.defined() || !t.is_cpu() || !impl_->shm || !impl_->shm->arena()) return false;
  return impl_->shm->arena()->offset_of(t.data_ptr(), t.nbytes()) != 0;
}

troupe::device process_group::device() const noexcept { return cpu_device; }

tensor process_group::make_buffer(shape_t shape, troupe::dtype dt) { return empty_shared(std::move(shape), dt); }

}  // namespace troupe::ddp
