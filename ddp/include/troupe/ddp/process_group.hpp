#pragma once
/// \file process_group.hpp
/// Process groups: collectives (allreduce, broadcast, allgather, reduce_scatter, reduce, gather,
/// scatter, all_to_all, barrier, send/recv) over a fixed set of ranks, and subgroups of them,
/// created from the rendezvous store. The CPU backend moves every byte through shared memory on
/// one host (Note [shm collectives] in shm_transport.hpp). Across hosts it uses a direct TCP ring
/// (Note [tcp ring] in tcp_transport.hpp; see process_group_options::transport). The store and
/// the CAF connection carry only the rendezvous.
///
/// Every collective is asynchronous: it returns a `work` at once and a per-group worker thread
/// runs the collectives in issue order (several in flight complete in that order). The tensors
/// passed in must stay untouched until the work completed (the work keeps them alive).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/tls_options.hpp"
#include "troupe/actors/transport.hpp"
#include "troupe/ddp/collective_group.hpp"
#include "troupe/tensors/error.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe {
class flight_recorder;
class store_client;
}

namespace troupe::ddp {

class file_store;

/// Which transport a CPU process group moves its bytes over.
enum class transport_kind : std::uint8_t {
  automatic = 0,      ///< shared memory when every rank is on the same host, TCP otherwise
  shared_memory = 1,  ///< Note [shm collectives]: one host only
  tcp = 2,            ///< Note [tcp ring]: a direct TCP ring between the ranks, any hosts
};

/// Options of a process group.
struct process_group_options {
  /// Deadline of one collective once the worker started it (also bounds the rendezvous).
  std::chrono::milliseconds timeout{60000};
  /// Bytes of one pipeline chunk slot per rank (two slots per rank are mapped).
  std::size_t slot_bytes = std::size_t{4} << 20;
  /// Bytes of the send/recv mailbox per destination.
  std::size_t p2p_bytes = std::size_t{1} << 20;
  /// The transport; automatic picks by host identity (published in the store).
  transport_kind transport = transport_kind::automatic;
  /// TCP: the address this rank listens on and publishes to its peers: an IPv4 address or host
  /// name of this rank's interface (not 0.0.0.0). bad_argument when it does not resolve.
  std::string tcp_address = "127.0.0.1";
  /// TCP: mutual TLS on the ring and the send/recv connections (Note [tls] in
  /// troupe/actors/tls_context.hpp); empty is off. Every rank must use the same CA. The group's
  /// constructor throws bad_argument / io_error naming a missing or unreadable file.
  tls_options tls;
  /// TCP: bytes of one pipelined chunk on the ring.
  std::size_t tcp_chunk_bytes = std::size_t{1} << 20;
  /// Shared memory: address space of this rank's shared arena (empty_shared); memory is taken
  /// only for the tensors allocated in it. 0 disables it.
  std::size_t shared_arena_bytes = std::size_t{1} << 30;
  /// Where collectives are recorded (node::shared_recorder(), Note [flight recorder]); null
  /// records nothing. A failed collective writes its trace (node_options::trace_dir).
  std::shared_ptr<flight_recorder> recorder;
  /// A collective that runs this long makes this rank tell who is where (Note [hang blame] in
  /// src/collective_watch.hpp); zero turns the report off. Keep it below `timeout`. A failed
  /// collective's error names who is where in any case.
  std::chrono::milliseconds blame_after{5000};
  /// Receives each hang report (on the group's watch thread; it must not block long); null
  /// prints it on stderr.
  std::function<void(const std::string&)> on_blame;
  /// NCCL: compare every collective's fingerprint across ranks through the store before it
  /// launches (Note [NCCL fingerprints]). It costs one store write and world_size - 1 reads per
  /// collective, and the store must outlive the group. CPU groups always compare, in band.
  bool check_fingerprints = true;
  /// Receives the library's fault points (collective_group::fault_point); env_process_group
  /// sets it to its node's fault plan (node::fault_point). Null: they are ignored.
  std::function<void(const std::string& point, std::int64_t step)> fault_points;
  /// Decides the fate of this rank's payload of each collective and send before it leaves
  /// (Note [collective payload faults] in src/payload_faults.hpp): drop, delay or repeat it.
  /// The NCCL group asks it too, before each collective or send batch launches.
  /// env_process_group sets it to its node's fault plan (node::payload_fault). Null: no cost
  /// but one branch per collective.
  std::function<transport_decision(envelope&)> payload_faults;
  /// A group on a node's store watches its members and fails at their loss (Note [group peer
  /// loss]). false leaves that to the caller (a group composed of process groups watches every
  /// member once and breaks its parts with break_group).
  bool watch_peers = true;
};

/// A CPU group of `world_size` processes, identified by `name` in the store (a collective_group:
/// Note [Collective group guarantees]). Move-only.
/// Collectives must be issued in the same order on every rank (the fingerprint check turns a
/// different op, dtype or size into errc::collective_mismatch on every rank, not a hang).
class process_group : public collective_group {
 public:
  /// Rendezvous through `store`; blocks up to opts.timeout. The group keeps using the store for
  /// hang blame, so it must outlive the group. Each rank maps one shared segment and publishes
  /// its name and pid under "troupe/pg/<name>/<rank>". Every rank maps every peer's segment.
  /// Then the names are unlinked, so nothing leaks if a process dies later.
  /// Throws bad_argument (rank outside [0, world_size), bad name), timeout (a rank never came),
  /// io_error (a segment cannot be made or mapped).
  process_group(store_client& store, int rank, int world_size, std::string name, process_group_options opts = {});
  /// The same rendezvous through a file_store (ranks on one host without a runtime node).
  process_group(const file_store& store, int rank, int world_size, std::string name, process_group_options opts = {});
  ~process_group() override;
  process_group(process_group&&) noexcept;
  process_group& operator=(process_group&&) noexcept;
  process_group(const process_group&) = delete;
  process_group& operator=(const process_group&) = delete;

  int rank() const noexcept override;
  int world_size() const noexcept override;
  const std::string& name() const noexcept override;
  /// Always cpu.
  troupe::device device() const noexcept override;

  /// In place: every rank's `t` becomes op(t over all ranks). `t`: contiguous CPU tensor, any
  /// dtype. Every collective validates its arguments on the calling thread and throws at once
  /// (bad_argument: undefined, non-contiguous, bad rank; device_mismatch: CUDA; shape_mismatch:
  /// sizes that do not fit), consuming no sequence number. Errors of the run come through the
  /// work:
  /// - collective_mismatch: ranks disagree; the group stays usable;
  /// - peer_lost: a rank died or failed;
  /// - timeout: the group is broken afterwards, and later works fail at once.
  work allreduce(tensor t, reduce_op op = reduce_op::sum) override;
  /// In place: every rank's `t` becomes `root`'s `t`.
  work broadcast(tensor t, int root) override;
  /// `output` (world_size * input.numel() elements, same dtype) receives every rank's `input`
  /// in rank order.
  work allgather(tensor output, tensor input) override;
  /// `output` receives block `rank` of op over every rank's `input` (world_size * output.numel()
  /// elements, same dtype).
  work reduce_scatter(tensor output, tensor input, reduce_op op = reduce_op::sum) override;
  /// In place on `root`: its `t` becomes op(t over all ranks); the other ranks' `t` stay as
  /// they were. The same checks as allreduce, and bad_argument for a root outside the group.
  work reduce(tensor t, int root, reduce_op op = reduce_op::sum);
  /// On `root`, `output` (world_size * input.numel() elements, same dtype) receives every rank's
  /// `input` in rank order. Other ranks ignore `output` (it may be undefined).
  work gather(tensor output, tensor input, int root);
  /// `output` receives block `rank` of `root`'s `input` (world_size * output.numel() elements,
  /// same dtype). Other ranks ignore `input` (it may be undefined).
  work scatter(tensor output, tensor input, int root);
  /// `input` and `output` hold world_size blocks of input.numel() / world_size elements each
  /// (same dtype and size): block j of rank r's `input` lands in block r of rank j's `output`.
  /// shape_mismatch when the sizes differ or do not split into world_size blocks.
  work all_to_all(tensor output, tensor input);
  /// Completes when every rank issued its barrier.
  work barrier() override;
  /// Names the next collective issued on this group, e.g. "bucket 2" (DDP's reducer names its
  /// bucket allreduces): its description, its recorder entry and hang reports carry `note`.
  /// Thread-safe; the note goes to whichever collective is issued next.
  void note_next(std::string note) override;
  void fault_point(const std::string& point, std::int64_t step) override;
  /// Like barrier(), but when it does not complete within `timeout` the error (errc::timeout)
  /// names the ranks that did not arrive. Blocks the calling thread.
  void monitored_barrier(std::chrono::milliseconds timeout) override;
  /// Breaks the group as a lost member does (Note [group peer loss]). This rank's running and
  /// later collectives fail with peer_lost carrying `reason`. Then the group aborts, so the
  /// peers' waits on this rank fail with peer_lost too. Never blocks; thread-safe. Groups
  /// composed of process groups use it to fail every part when one part fails.
  void break_group(const std::string& reason) noexcept;
  /// Sends `t` to rank `dst`; messages between a pair with the same tag arrive in order. A send
  /// larger than the mailbox completes only when `dst` runs the matching recv.
  work send(tensor t, int dst, int tag = 0);
  /// Receives into `t` from rank `src`; errc::collective_mismatch when the sender's dtype,
  /// element count or tag differ.
  work recv(tensor t, int src, int tag = 0);

  /// A zero-filled contiguous CPU tensor that lives in this rank's shared arena, mapped by every
  /// rank of the group (Note [shm zero copy]). An allreduce of such tensors on every rank reads
  /// the peers' data in place, with no copy in or out of staging slots. Contiguous views of them
  /// do so too. Any tensor op works on it; it may outlive the group. Falls back to an
  /// ordinary zero tensor (same results, the copying path) with the TCP transport, or when the
  /// arena is full or disabled. Never blocks on peers; thread-safe. Throws bad_argument for a
  /// negative size.
  tensor empty_shared(shape_t shape, troupe::dtype dt = troupe::dtype::float32);
  /// True when `t`'s bytes lie in this rank's shared arena (empty_shared made them).
  bool is_shared(const tensor& t) const;
  /// empty_shared(shape, dt).
  tensor make_buffer(shape_t shape, troupe::dtype dt) override;

  /// A subgroup of the ranks in `ranks` (this group's numbering), like torch's new_group. Every
  /// rank of this group calls it, in the same order and with the same `ranks`. It first checks
  /// that they agree with one allgather on this group; errc::collective_mismatch on every rank
  /// when they do not. Then the members meet through `store` as a new group named
  /// "<name>-g<k>" (k counts this group's new_group calls). A member's rank in the subgroup is
  /// its position in the sorted `ranks`; a rank not in `ranks` gets nullopt. Blocks up to
  /// opts.timeout. Throws bad_argument for an empty list, a duplicate, or a rank outside the
  /// group (before any collective), and what the constructor throws.
  std::optional<process_group> new_group(store_client& store, std::vector<int> ranks, process_group_options opts = {});
  /// The same through a file_store.
  std::optional<process_group> new_group(const file_store& store, std::vector<int> ranks, process_group_options opts = {});

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::ddp
