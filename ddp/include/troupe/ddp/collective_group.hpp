#pragma once
/// \file collective_group.hpp
/// The interface every process group implements: the shared-memory and TCP `process_group` and
/// the `nccl_process_group`. DDP and user code that only needs the common collectives take a
/// `collective_group&`, so the same code runs on CPU and on CUDA.
///
/// Note [Collective group guarantees]
/// ----------------------------------
/// Every implementation gives the same guarantees:
/// - Fingerprints. Before a collective moves data, the ranks compare (op, dtype, shape, sequence
///   number). A mismatch fails the collective with collective_mismatch on every rank, never a
///   hang. CPU groups compare in band (Note [shm collectives], Note [tcp ring]); the NCCL group
///   compares through the store before it launches (Note [NCCL fingerprints]).
/// - Work handles. Every collective returns a `work` at once; `work::wait(timeout)` bounds the
///   wait and throws timeout naming the collective.
/// - Monitored barrier. `monitored_barrier(timeout)` names the ranks that did not arrive.
/// - Failure. A rank that dies or hangs fails every other rank's collectives with a named error
///   (peer_lost, timeout, nccl_failure) within the group's timeout. A CPU group sees the peer's
///   death; the NCCL group polls asynchronous errors and a watchdog aborts the communicator of a
///   collective that outlives the timeout (Note [NCCL watchdog]).
/// - Issue order. Collectives must be issued in the same order on every rank.

#include <chrono>
#include <string>

#include "troupe/ddp/work.hpp"
#include "troupe/tensors/device.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe::ddp {

/// A group of `world_size()` ranks running collectives on tensors of one device
/// (Note [Collective group guarantees]). Not copyable; implementations are move-only.
/// Every collective validates its arguments on the calling thread and throws at once
/// (bad_argument, device_mismatch, shape_mismatch, dtype_mismatch); errors of the run come
/// through the work.
class collective_group {
 public:
  virtual ~collective_group() = default;

  /// This rank, in [0, world_size()).
  virtual int rank() const noexcept = 0;
  /// The number of ranks.
  virtual int world_size() const noexcept = 0;
  /// The group's name in the rendezvous store.
  virtual const std::string& name() const noexcept = 0;
  /// The device of the tensors the collectives take: cpu for `process_group`, this rank's
  /// CUDA device for `nccl_process_group`.
  virtual troupe::device device() const noexcept = 0;

  /// In place: every rank's `t` becomes op(t over all ranks).
  virtual work allreduce(tensor t, reduce_op op = reduce_op::sum) = 0;
  /// In place: every rank's `t` becomes `root`'s `t`.
  virtual work broadcast(tensor t, int root) = 0;
  /// `output` (world_size * input.numel() elements, same dtype) receives every rank's `input`
  /// in rank order.
  virtual work allgather(tensor output, tensor input) = 0;
  /// `output` receives block `rank` of op over every rank's `input`.
  virtual work reduce_scatter(tensor output, tensor input, reduce_op op = reduce_op::sum) = 0;
  /// Completes when every rank issued its barrier.
  virtual work barrier() = 0;
  /// Blocks until every rank arrived; at `timeout` throws errc::timeout naming the ranks that
  /// did not arrive.
  virtual void monitored_barrier(std::chrono::milliseconds timeout) = 0;
  /// A zero-filled contiguous tensor on device(), placed where this group's collectives are
  /// fastest (the shared arena of a shared-memory group). Throws bad_argument for a negative size.
  virtual tensor make_buffer(shape_t shape, troupe::dtype dt) = 0;
  /// Names the next collective issued on this group, e.g. "bucket 2", for its recorder entry and
  /// hang reports (Note [hang blame]); groups without a recorder ignore it.
  virtual void note_next(std::string note) { (void)note; }
  /// Reports that this rank reached a fault point of the library at `step` (Note [fault events]
  /// in troupe/actors/fault_plan.hpp). The points are "forward", "backward", "allreduce",
  /// "allreduce_done" and "checkpoint". A plan may kill, pause or delay the rank there. Groups
  /// given process_group_options::fault_points pass it on; others ignore it.
  virtual void fault_point(const std::string& point, std::int64_t step) {
    (void)point;
    (void)step;
  }

 protected:
  collective_group() = default;
  collective_group(const collective_group&) = default;
  collective_group(collective_group&&) = default;
  collective_group& operator=(const collective_group&) = default;
  collective_group& operator=(collective_group&&) = default;
};

}  // namespace troupe::ddp
