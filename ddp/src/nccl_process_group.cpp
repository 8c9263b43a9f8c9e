// The NCCL process group: bootstrap through the store, argument checks and launches on the
// calling thread, the in-flight list that keeps tensors alive (Note [NCCL process group]).
#include "troupe/ddp/nccl_process_group.hpp"

#include "member_watch.hpp"
#include "payload_faults.hpp"
#include "shm_transport.hpp"  // detail::rendezvous
#include "store_checks.hpp"
#include "work_state.hpp"
#include "troupe/actors/store.hpp"
#include "troupe/ddp/file_store.hpp"

#if defined(TROUPE_WITH_NCCL)

#include <cstdio>
#include <deque>
#include <functional>
#include <utility>

#include "nccl_comm.hpp"
#include "periodic_thread.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::ddp {

namespace {

using nccl_detail::clock;
using launch_fn = std::function<ncclResult_t(ncclComm_t, cudaStream_t)>;

troupe::device checked_device(troupe::device d, int rank, int world, const std::string& name) {
  const std::string who = "nccl_process_group '" + name + "'";
  if (world < 1 || rank < 0 || rank >= world)
    throw troupe::error(errc::bad_argument, who + ": rank " + std::to_string(rank) + " outside [0, " + std::to_string(world) + ")");
  if (name.empty() || name.find('/') != std::string::npos)
    throw troupe::error(errc::bad_argument, who + ": the group name must be non-empty and hold no '/'");
  const int n = cuda::device_count();
  if (!d.is_cuda() || d.index < 0 || d.index >= n)
    throw troupe::error(errc::device_mismatch, who + " rank " + std::to_string(rank) + ": device " + troupe::to_string(d) +
                                                   " is not a visible CUDA device (" + std::to_string(n) + " visible)");
  return d;
}

std::string to_hex(const ncclUniqueId& id) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * sizeof id.internal);
  for (char c : id.internal) {
    const auto b = static_cast<unsigned char>(c);
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

ncclUniqueId from_hex(const std::string& s, const std::string& who) {
  ncclUniqueId id{};
  auto nibble = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    throw troupe::error(errc::protocol_violation, who + ": the published NCCL unique id is not lowercase hex");
  };
  if (s.size() != 2 * sizeof id.internal)
    throw troupe::error(errc::protocol_violation, who + ": the published NCCL unique id has " + std::to_string(s.size()) +
                                                      " hex digits, expected " + std::to_string(2 * sizeof id.internal));
  for (std::size_t i = 0; i < sizeof id.internal; ++i)
    id.internal[i] = static_cast<char>((nibble(s[2 * i]) << 4) | nibble(s[2 * i + 1]));
  return id;
}

ncclDataType_t to_nccl(troupe::dtype t, const std::string& who) {
  switch (t) {
    case dtype::float32: return ncclFloat32;
    case dtype::float64: return ncclFloat64;
    case dtype::float16: return ncclFloat16;
    case dtype::bfloat16: return ncclBfloat16;
    case dtype::int32: return ncclInt32;
    case dtype::int64: return ncclInt64;
    case dtype::uint8: case dtype::boolean: return ncclUint8;
  }
  throw troupe::error(errc::bad_argument, who + ": dtype " + std::string(troupe::to_string(t)) + " has no NCCL type");
}

ncclRedOp_t to_nccl(reduce_op op, troupe::dtype t) {
  if (t == dtype::boolean)  // bytes 0/1: or = max, and = min
    return (op == reduce_op::min || op == reduce_op::product) ? ncclMin : ncclMax;
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::avg: return ncclAvg;  // integers: sum then truncating division
    case reduce_op::min: return ncclMin;
    case reduce_op::max: return ncclMax;
    case reduce_op::product: return ncclProd;
  }
  return ncclSum;
}

std::string shape_of(const tensor& t) { return std::string(troupe::to_string(t.dtype())) + shape_to_string(t.shape()); }

}  // namespace

struct nccl_process_group::impl {
  int rank;
  int world;
  std::string name;
  troupe::device dev;
  process_group_options opts;
  std::shared_ptr<nccl_detail::communicator> comm = std::make_shared<nccl_detail::communicator>();
  cuda::stream stream;  // the dedicated NCCL stream
  cuda::event ready;    // reused: recorded on the caller's stream, waited on by `stream` (under comm->mu)
  tensor barrier_buf;
  std::uint64_t issued = 0;  // under comm->mu
  std::string next_note;     // note_next(); taken by the next launch (under launch_mu)
  std::mutex inflight_mu;
  std::deque<std::shared_ptr<nccl_work::state>> inflight;
  detail::store_checks checks;       // Note [NCCL fingerprints]; used under launch_mu
  std::mutex launch_mu;              // one fingerprint exchange + launch at a time
  std::uint64_t fingerprinted = 0;   // under launch_mu
  std::unique_ptr<detail::periodic_thread> watchdog;  // Note [NCCL watchdog]
  std::mutex lost_mu;
  std::optional<std::string> lost;  // a lost member, for the watchdog to abort on (Note [group peer loss])
  std::unique_ptr<detail::payload_faults> faults;  // Note [collective payload faults]; null without a hook
  std::uint32_t collectives_made = 0, sends_made = 0;  // number the payloads for the hook (under launch_mu)
  std::optional<detail::member_watch> members;  // declared last: ends before what its listener touches

  impl(const detail::rendezvous& rv, detail::check_store cs, int r, int w, std::string n, troupe::device d,
       const process_group_options& o)
      : rank(r), world(w), name(std::move(n)), dev(checked_device(d, r, w, name)), opts(o), stream(dev.index), ready(dev.index),
        checks(std::move(cs), "troupe/nccl/" + name, r, w, label_of(name, r, dev)) {
    comm->device = dev.index;
    comm->label = label_of(name, rank, dev);
    init_comm(exchange_id(rv));
    if (opts.payload_faults) faults = std::make_unique<detail::payload_faults>(opts.payload_faults, name, rank);
    barrier_buf = empty({1}, {dtype::uint8, dev});  // its value is never read
    const auto tick = std::clamp(opts.timeout / 20, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
    watchdog = std::make_unique<detail::periodic_thread>(tick, [this] { watch(); });
    if (rv.events && world > 1)
      members.emplace(rv, "troupe/nccl/" + name + "/worker/", rank, world, opts.timeout, [this](int m, const peer_loss& l) {
        std::lock_guard<std::mutex> lock(lost_mu);  // never comm->mu: a launch may hold it for long
        if (!lost) lost = detail::member_watch::describe(m, l);
      });
  }

  ~impl() {
    if (faults) faults->stop();
    members.reset();   // no more losses reported
    watchdog.reset();  // before the teardown: the watchdog reads the in-flight list
    shutdown();
  }

  static std::string label_of(const std::string& n, int r, troupe::device d) {
    return "nccl_process_group '" + n + "' rank " + std::to_string(r) + " on " + troupe::to_string(d);
  }

  /// The watchdog's step: aborts the communicator after a member was lost, drops completed
  /// works, fails the oldest one that outlived the timeout.
  void watch() {
    abort_if_lost();
    std::lock_guard<std::mutex> lock(inflight_mu);
    while (!inflight.empty() && inflight.front()->poll()) inflight.pop_front();
    if (inflight.empty()) return;
    const auto& s = inflight.front();
    const auto running = clock::now() - s->launched_at;
    if (opts.blame_after.count() > 0 && running > opts.blame_after && !s->blamed) {
      s->blamed = true;
      blame(*s, std::chrono::duration_cast<std::chrono::milliseconds>(running));
    }
    if (running <= opts.timeout) return;
    s->expire(troupe::error(errc::timeout, s->description + ": the watchdog found it still running " +
                                               std::to_string(opts.timeout.count()) +
                                               " ms after its launch (a rank died or hangs); the communicator was aborted"));
  }

  const std::string& label() const { return comm->label; }

  /// Note [NCCL flight recorder]: the report on a collective past opts.blame_after.
  void blame(const nccl_work::state& s, std::chrono::milliseconds running) const {
    std::string text = s.description + " still runs after " + std::to_string(running.count()) + " ms";
    if (opts.recorder) {
      std::string last;
      for (const auto& e : opts.recorder->last(4))
        if (e.kind == trace_kind::collective && e.ended) last = e.name + " #" + std::to_string(e.seq);
      text += last.empty() ? "; no collective of this rank completed before it" : "; this rank's last completed: " + last;
    }
    text += opts.check_fingerprints ? " (every rank issued it: the fingerprints matched; a rank died or hangs inside it)"
                                    : " (fingerprints off: a rank may not have issued it)";
    if (opts.on_blame) opts.on_blame(text);
    else std::fprintf(stderr, "troupe: %s\n", text.c_str());
  }

  /// A member lost (Note [group peer loss]) ends the communicator: every work in flight and every
  /// later collective fails with peer_lost naming the member.
  void abort_if_lost() {
    std::optional<std::string> why;
    {
      std::lock_guard<std::mutex> lock(lost_mu);
      why = lost;
    }
    if (!why) return;
    std::lock_guard<std::mutex> lock(comm->mu);
    if (!comm->dead) comm->abort_locked(troupe::error(errc::peer_lost, label() + ": " + *why + "; the communicator was aborted"));
  }

  ncclUniqueId exchange_id(const detail::rendezvous& rv) {
    const std::string key = "troupe/nccl/" + name + "/unique_id";
    if (rank == 0) {
      ncclUniqueId id{};
      TROUPE_NCCL_CHECK(ncclGetUniqueId(&id));
      rv.set(key, to_hex(id));
      return id;
    }
    return from_hex(rv.get(key, opts.timeout), label());
  }

  void init_comm(const ncclUniqueId& id) {
    nccl_detail::device_guard g(dev.index);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;  // init and collectives return ncclInProgress: bounded by our deadline
    cfg.commName = name.c_str();
    const auto deadline = clock::now() + opts.timeout;
    std::lock_guard<std::mutex> lock(comm->mu);
    ncclComm_t c = nullptr;
    const ncclResult_t r = ncclCommInitRankConfig(&c, world, id, rank, &cfg);
    comm->comm = c;
    if (c == nullptr && r != ncclSuccess && r != ncclInProgress)
      throw nccl_detail::nccl_error(r, label(), "ncclCommInitRankConfig(&c, world, id, rank, &cfg)", __FILE__, __LINE__);
    TROUPE_NCCL_SETTLE(*comm, r, deadline);
  }

  /// Drops the completed works from the front of the in-flight list (the stream is in order).
  void prune() {
    std::lock_guard<std::mutex> lock(inflight_mu);
    while (!inflight.empty() && inflight.front()->poll()) inflight.pop_front();
  }

  /// Compares the fingerprint `what` across ranks; the error for the work, if any. A rank that
  /// never came aborts the communicator.
  std::optional<troupe::error> check_fingerprint(const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(comm->mu);
      comm->ensure_alive_locked(what);
    }
    auto e = checks.compare(++fingerprinted, what, opts.timeout);
    if (e && (e->code() == errc::timeout || e->code() == errc::peer_lost)) {  // peer_lost: a peer's payload was dropped
      std::lock_guard<std::mutex> lock(comm->mu);
      comm->abort_locked(*e);
    }
    return e;
  }

  /// `collective`: every rank issues it, so its fingerprint is compared first.
  work launch(const std::string& what, std::vector<tensor> keep, const char* call, const launch_fn& body, bool collective = true) {
    prune();  // outside comm->mu: poll() locks a work state, then comm->mu
    std::lock_guard<std::mutex> order(launch_mu);
    using fate = detail::payload_faults::fate;
    const fate f = faults ? payload_fate(what, collective) : fate::deliver;  // Note [collective payload faults]
    if (f == fate::drop) return drop_payload(what, collective);
    if (collective && opts.check_fingerprints && world > 1)
      if (auto e = check_fingerprint(what)) return detail::failed_work(label() + ": " + what, std::move(*e));
    if (f == fate::repeat && collective && opts.check_fingerprints) checks.repeat_last();
    std::shared_ptr<nccl_work::state> s;
    {
      std::lock_guard<std::mutex> lock(comm->mu);
      comm->ensure_alive_locked(what);
      const std::string note = std::exchange(next_note, {});
      s = std::make_shared<nccl_work::state>(comm, label() + ": " + what + " #" + std::to_string(++issued) +
                                                       (note.empty() ? "" : " (" + note + ")"));
      if (opts.recorder) {  // Note [NCCL flight recorder]
        s->recorder = opts.recorder;
        s->token = opts.recorder->begin(trace_kind::collective, what.substr(0, what.find(' ')), issued, note.empty() ? what : note);
      }
      nccl_detail::device_guard g(dev.index);
      ready.record(cuda::current_stream(dev.index));
      ready.wait(stream.handle());
      comm->settle_locked(body(comm->comm, static_cast<cudaStream_t>(stream.handle())), call, __FILE__, __LINE__,
                          clock::now() + opts.timeout);
      s->done.record(stream.handle());
      s->keep = std::move(keep);
    }
    std::lock_guard<std::mutex> lock(inflight_mu);
    inflight.push_back(s);
    return nccl_detail::as_work(nccl_work(s));
  }

  /// Note [collective payload faults] on NCCL: asks the hook about this rank's payload (a
  /// collective, or a batch with a send); waits out a delay, so the rank enters late. Under launch_mu.
  detail::payload_faults::fate payload_fate(const std::string& what, bool collective) {
    if (!collective && what.find(" send ") == std::string::npos) return detail::payload_faults::fate::deliver;  // receives only
    const std::string op = collective ? what.substr(0, what.find_first_of(" (")) : "send";
    return faults->apply(op, collective ? ++collectives_made : ++sends_made, next_note);
  }

  /// A dropped payload: this rank fails with io_error and its communicator is aborted; with
  /// fingerprints on, the peers read the loss in its place and fail with peer_lost naming it.
  /// A dropped send's receiver fails at its watchdog timeout. Under launch_mu.
  work drop_payload(const std::string& what, bool collective) {
    const std::string op = collective ? what.substr(0, what.find_first_of(" (")) : "send";
    const troupe::error e = faults->dropped(op, collective ? collectives_made : sends_made);
    if (collective) next_note.clear();  // the note named this collective
    if (collective && opts.check_fingerprints) {
      try {
        checks.publish_lost(++fingerprinted, e.message());
      } catch (const troupe::error&) {
        // the peers fail at their fingerprint deadline instead
      }
    }
    {
      std::lock_guard<std::mutex> lock(comm->mu);
      comm->abort_locked(e);
    }
    return detail::failed_work(label() + ": " + what, e);
  }

  void check_tensor(const char* op, const tensor& t) const {
    const std::string who = label() + ": " + op;
    if (!t.defined()) throw troupe::error(errc::bad_argument, who + ": undefined tensor");
    if (t.device() != dev)
      throw troupe::error(errc::device_mismatch, who + ": tensor " + shape_of(t) + " is on " + troupe::to_string(t.device()) +
                                                     ", the group's device is " + troupe::to_string(dev));
    if (!t.is_contiguous()) throw troupe::error(errc::bad_argument, who + ": tensor " + shape_of(t) + " is not contiguous");
    to_nccl(t.dtype(), who);
  }

  void check_rank(const char* op, int r) const {
    if (r < 0 || r >= world)
      throw troupe::error(errc::bad_argument, label() + ": " + op + ": rank " + std::to_string(r) + " outside [0, " +
                                                  std::to_string(world) + ")");
  }

  void check_pair(const char* op, const tensor& whole, const tensor& part) const {
    if (whole.dtype() != part.dtype())
      throw troupe::error(errc::dtype_mismatch, label() + ": " + op + ": dtypes differ: " + shape_of(whole) + " and " + shape_of(part));
    if (whole.numel() != part.numel() * world)
      throw troupe::error(errc::shape_mismatch, label() + ": " + op + ": " + shape_of(whole) + " must hold world_size (" +
                                                    std::to_string(world) + ") x " + shape_of(part));
  }

  /// Waits for the works in flight, then finalizes and destroys the communicator (aborts it
  /// when they do not finish by opts.timeout or it failed). Never throws.
  void shutdown() noexcept {
    const auto deadline = clock::now() + opts.timeout;
    bool drained = true;
    {
      std::lock_guard<std::mutex> lock(inflight_mu);
      for (auto& s : inflight) {
        nccl_detail::backoff b;
        while (!s->poll()) {
          if (clock::now() >= deadline) { drained = false; break; }
          b.pause();
        }
        if (!drained) break;
      }
    }
    std::lock_guard<std::mutex> lock(comm->mu);
    try {
      if (drained && !comm->dead && comm->comm != nullptr) {
        nccl_detail::device_guard g(dev.index);
        TROUPE_NCCL_SETTLE(*comm, ncclCommFinalize(comm->comm), deadline);  // aborts on failure
        if (comm->comm != nullptr) static_cast<void>(ncclCommDestroy(comm->comm));
        comm->comm = nullptr;
      }
    } catch (const troupe::error&) {
      // settle_locked aborted the communicator and recorded why
    }
    comm->abort_locked(troupe::error(errc::invalid_state, drained ? "the process group was destroyed"
                                                                  : "the process group was destroyed with collectives in flight"));
    // The aborted kernels leave the stream; the tensors of the works are freed only after that.
    try {
      stream.synchronize(std::chrono::seconds(10));
    } catch (const troupe::error&) {
      // a stream that does not drain after the abort: nothing more can be done here
    }
  }
};

nccl_process_group::nccl_process_group(store_client& store, int rank, int world_size, std::string name,
                                       troupe::device device, process_group_options opts) {
  detail::rendezvous rv{[&store](const std::string& k, const std::string& v) { store.set(k, v); },
                        [&store](const std::string& k, std::chrono::milliseconds t) { return store.get(k, t); }, nullptr,
                        store.peer_losses()};
  detail::check_store cs{rv.set, rv.get, [&store](const std::string& k) { store.erase(k); }};
  impl_ = std::make_unique<impl>(rv, std::move(cs), rank, world_size, std::move(name), device, opts);
}

nccl_process_group::nccl_process_group(const file_store& store, int rank, int world_size, std::string name,
                                       troupe::device device, process_group_options opts) {
  detail::rendezvous rv{[&store](const std::string& k, const std::string& v) { store.set(k, v); },
                        [&store](const std::string& k, std::chrono::milliseconds t) { return store.get(k, t); }, nullptr, nullptr};
  detail::check_store cs{rv.set, rv.get, nullptr};  // a file_store keeps its keys in its directory
  impl_ = std::make_unique<impl>(rv, std::move(cs), rank, world_size, std::move(name), device, opts);
}

nccl_process_group::~nccl_process_group() = default;
nccl_process_group::nccl_process_group(nccl_process_group&&) noexcept = default;
nccl_process_group& nccl_process_group::operator=(nccl_process_group&&) noexcept = default;

void nccl_process_group::note_next(std::string note) {
  std::lock_guard<std::mutex> lock(impl_->launch_mu);
  impl_->next_note = std::move(note);
}

int nccl_process_group::rank() const noexcept { return impl_->rank; }
int nccl_process_group::world_size() const noexcept { return impl_->world; }
const std::string& nccl_process_group::name() const noexcept { return impl_->name; }
troupe::device nccl_process_group::device() const noexcept { return impl_->dev; }

work nccl_process_group::allreduce(tensor t, reduce_op op) {
  impl_->check_tensor("allreduce", t);
  const auto dt = to_nccl(t.dtype(), "allreduce");
  const auto rop = to_nccl(op, t.dtype());
  void* p = t.data_ptr();
  const auto n = static_cast<std::size_t>(t.numel());
  return impl_->launch("allreduce(" + std::string(to_string(op)) + ") " + shape_of(t), {t}, "ncclAllReduce",
                       [=](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(p, p, n, dt, rop, c, s); });
}

work nccl_process_group::broadcast(tensor t, int root) {
  impl_->check_tensor("broadcast", t);
  impl_->check_rank("broadcast", root);
  const auto dt = to_nccl(t.dtype(), "broadcast");
  void* p = t.data_ptr();
  const auto n = static_cast<std::size_t>(t.numel());
  return impl_->launch("broadcast from " + std::to_string(root) + " " + shape_of(t), {t}, "ncclBroadcast",
                       [=](ncclComm_t c, cudaStream_t s) { return ncclBroadcast(p, p, n, dt, root, c, s); });
}

work nccl_process_group::allgather(tensor output, tensor input) {
  impl_->check_tensor("allgather", output);
  impl_->check_tensor("allgather", input);
  impl_->check_pair("allgather", output, input);
  const auto dt = to_nccl(input.dtype(), "allgather");
  const void* in = input.data_ptr();
  void* out = output.data_ptr();
  const auto n = static_cast<std::size_t>(input.numel());
  return impl_->launch("allgather " + shape_of(input), {output, input}, "ncclAllGather",
                       [=](ncclComm_t c, cudaStream_t s) { return ncclAllGather(in, out, n, dt, c, s); });
}

work nccl_process_group::reduce_scatter(tensor output, tensor input, reduce_op op) {
  impl_->check_tensor("reduce_scatter", output);
  impl_->check_tensor("reduce_scatter", input);
  impl_->check_pair("reduce_scatter", input, output);
  const auto dt = to_nccl(input.dtype(), "reduce_scatter");
  const auto rop = to_nccl(op, input.dtype());
  const void* in = input.data_ptr();
  void* out = output.data_ptr();
  const auto n = static_cast<std::size_t>(output.numel());
  return impl_->launch("reduce_scatter(" + std::string(to_string(op)) + ") " + shape_of(input), {output, input},
                       "ncclReduceScatter", [=](ncclComm_t c, cudaStream_t s) { return ncclReduceScatter(in, out, n, dt, rop, c, s); });
}

work nccl_process_group::barrier() {
  void* p = impl_->barrier_buf.data_ptr();
  return impl_->launch("barrier", {impl_->barrier_buf}, "ncclAllReduce (barrier)",
                       [=](ncclComm_t c, cudaStream_t s) { return ncclAllReduce(p, p, 1, ncclUint8, ncclMax, c, s); });
}

work nccl_process_group::send(tensor t, int dst) {
  if (dst == rank())
    throw troupe::error(errc::bad_argument, impl_->label() + ": send: a lone send to self never completes; use batch_p2p");
  return batch_p2p({p2p_op::send(std::move(t), dst)});
}

work nccl_process_group::recv(tensor t, int src) {
  if (src == rank())
    throw troupe::error(errc::bad_argument, impl_->label() + ": recv: a lone receive from self never completes; use batch_p2p");
  return batch_p2p({p2p_op::recv(std::move(t), src)});
}

work nccl_process_group::batch_p2p(std::vector<p2p_op> ops) {
  if (ops.empty()) throw troupe::error(errc::bad_argument, impl_->label() + ": batch_p2p: no operations");
  std::vector<tensor> keep;
  std::string what = "p2p";
  for (const auto& o : ops) {
    impl_->check_tensor(o.is_send ? "send" : "recv", o.t);
    impl_->check_rank(o.is_send ? "send" : "recv", o.peer);
    keep.push_back(o.t);
    what += (o.is_send ? " send " : " recv ") + shape_of(o.t) + (o.is_send ? " to " : " from ") + std::to_string(o.peer);
  }
  auto body = [ops](ncclComm_t c, cudaStream_t s) {
    ncclResult_t first = ncclGroupStart();
    if (first != ncclSuccess) return first;
    for (const auto& o : ops) {
      const auto n = static_cast<std::size_t>(o.t.numel());
      const auto dt = to_nccl(o.t.dtype(), "batch_p2p");
      const ncclResult_t r = o.is_send ? ncclSend(o.t.data_ptr(), n, dt, o.peer, c, s) : ncclRecv(o.t.data_ptr(), n, dt, o.peer, c, s);
      if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess) first = r;
    }
    const ncclResult_t end = ncclGroupEnd();  // always closes the group, even after an error
    return first != ncclSuccess ? first : end;
  };
  return impl_->launch(what, std::move(keep), "ncclGroupStart; ncclSend/ncclRecv...; ncclGroupEnd", body, false);
}

void nccl_process_group::monitored_barrier(std::chrono::milliseconds timeout) {
  {
    std::lock_guard<std::mutex> lock(impl_->comm->mu);
    impl_->comm->ensure_alive_locked("monitored_barrier");
  }
  std::lock_guard<std::mutex> order(impl_->launch_mu);
  impl_->checks.monitored_barrier(timeout);
}

tensor nccl_process_group::make_buffer(shape_t shape, troupe::dtype dt) { return zeros(std::move(shape), {dt, impl_->dev}); }

void nccl_process_group::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(impl_->comm->mu);
  impl_->comm->abort_locked(troupe::error(errc::invalid_state, impl_->label() + ": aborted by the user: " + reason));
}

std::optional<troupe::error> nccl_process_group::failure() const {
  std::lock_guard<std::mutex> lock(impl_->comm->mu);
  return impl_->comm->dead;
}

}  // namespace troupe::ddp

#endif
