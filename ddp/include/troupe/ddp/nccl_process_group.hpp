#pragma once
/// \file nccl_process_group.hpp
/// The NCCL backend of the process group: the same collectives as `process_group`, on CUDA
/// tensors of one device per rank, run by NCCL on a dedicated stream.
///
/// Note [NCCL process group]
/// -------------------------
/// Bootstrap: rank 0 calls ncclGetUniqueId and publishes the 128 bytes (hex) under
/// "troupe/nccl/<name>/unique_id" in the rendezvous store; the other ranks get() it within
/// opts.timeout. Every rank then creates a *non-blocking* communicator (ncclConfig_t
/// blocking = 0). It polls ncclCommGetAsyncError until it leaves ncclInProgress. At the deadline
/// the communicator is aborted and errc::timeout thrown. So a rank that never comes cannot hang
/// the others.
///
/// One collective, on the calling thread:
///
///   caller's current stream:  ...compute... [ready]
///                                              |  (the NCCL stream waits on `ready`)
///   group's NCCL stream:                        [nccl kernel] [done]
///                                                               |  work::wait / synchronize_stream
///   caller's current stream:                                    ...next compute...
///
/// 1. validate (CUDA, this group's device, contiguous, sizes, dtypes) and throw at once;
/// 2. record `ready` on the caller's current stream, make the NCCL stream wait on it;
/// 3. launch; a launch answering ncclInProgress is polled to completion (bounded by opts.timeout);
/// 4. record the work's `done` event on the NCCL stream. The work (and the group, until it saw
///    the completion) keeps the tensors alive, so the caching allocator cannot hand their memory
///    out while NCCL still uses it.
///
/// Before step 2, with opts.check_fingerprints, the ranks compare the collective's fingerprint
/// through the store (Note [NCCL fingerprints] in store_checks.hpp). A mismatch fails the work
/// with collective_mismatch on every rank before anything launches. A rank that never issues the
/// collective fails it with timeout naming that rank, and the communicator is aborted.
///
/// Failure: `work::wait(timeout)` polls `done` and ncclCommGetAsyncError. An asynchronous
/// NCCL error, or the deadline, aborts the communicator (ncclCommAbort ends the kernels, so
/// nothing hangs) and throws nccl_failure / timeout. An aborted group is dead: every later call
/// throws invalid_state naming the cause; recovery means building a new group under a new name.
///
/// Peer loss: a group built on a node's store_client watches its members through the node
/// (Note [group peer loss] in src/member_watch.hpp). The node declares a dead member lost at
/// once, a frozen one after node_options::connection_timeout. A lost member makes the watchdog
/// abort the communicator at its next tick. So every work in flight fails with peer_lost naming
/// the rank and its worker. A group on a file_store has no node and relies on the watchdog's
/// timeout.
///
/// Note [NCCL watchdog]
/// --------------------
/// A watchdog thread per group polls the oldest collective in flight every
/// clamp(timeout / 20, 10 ms, 1 s). An asynchronous NCCL error aborts the communicator and fails
/// the work (nccl_failure). So does a collective still running opts.timeout after its launch
/// (timeout). This happens whether or not anybody waits on it. So a rank that dies or hangs
/// inside a collective fails every other rank within about opts.timeout, never a hang.
/// Assumes: one rank per device, the same collectives in the same order on every rank.
///
/// Note [NCCL flight recorder]
/// ---------------------------
/// With opts.recorder (node::shared_recorder()), each launch begins a collective entry: name,
/// sequence number, note_next's note or the description. The entry ends when the completion is
/// observed (a wait, a poll, or the watchdog's next tick), failed or not. A collective running
/// past opts.blame_after gets one report from the watchdog (opts.on_blame, else stderr). The
/// report holds its description, how long it runs, and this rank's last completed collective.
/// It says what the fingerprint check implies about the other ranks.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/ddp/collective_group.hpp"
#include "troupe/ddp/process_group.hpp"
#include "troupe/tensors/device.hpp"
#include "troupe/tensors/error.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe {
class store_client;
}

namespace troupe::ddp {

class file_store;

/// True when this build has the NCCL backend (TROUPE_WITH_NCCL). Never throws.
bool nccl_compiled() noexcept;

/// The NCCL side of one collective; the group's collectives return a `work` that delegates to
/// it. Copyable (copies share the state); thread-safe.
class nccl_work {
 public:
  struct state;
  nccl_work() = default;
  explicit nccl_work(std::shared_ptr<state> s) : state_(std::move(s)) {}

  /// Blocks the calling thread until the collective completed on the device. It polls the
  /// completion event and the communicator's asynchronous error. Then it makes the caller's
  /// current stream wait on the completion too. At the deadline, or on an NCCL error, it aborts
  /// the communicator and throws timeout / nccl_failure. Throws invalid_state when the group was
  /// aborted before, or for an empty handle; cuda_failure when the event query fails.
  void wait(std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;
  /// Makes the calling thread's current stream of the group's device wait for the collective.
  /// Never blocks the host. Throws invalid_state for an empty handle, cuda_failure.
  void synchronize_stream() const;
  /// True once the collective finished (successfully or not). Polls; never blocks for long.
  bool is_completed() const;
  /// The error the collective failed with; nullopt while running or after success.
  std::optional<troupe::error> error() const;
  /// False for a default-constructed work.
  bool valid() const noexcept { return state_ != nullptr; }
  /// What the collective was ("nccl_process_group 'g' rank 0: allreduce(sum) #3 float32[16]").
  std::string description() const;

 private:
  std::shared_ptr<state> state_;
};

/// One point-to-point operation of a `batch_p2p` group.
struct p2p_op {
  bool is_send = true;  ///< send `t` to `peer`, else receive into `t` from `peer`
  tensor t;             ///< contiguous CUDA tensor on the group's device
  int peer = 0;         ///< the other rank (may be this rank inside a batch)
  /// A send of `t` to `dst`.
  static p2p_op send(tensor t, int dst) { return {true, std::move(t), dst}; }
  /// A receive into `t` from `src`.
  static p2p_op recv(tensor t, int src) { return {false, std::move(t), src}; }
};

/// A process group over NCCL: one rank per CUDA device, `world_size` ranks, identified by
/// `name` in the store (Note [NCCL process group]). Move-only. Collectives are issued on the
/// calling thread (they return once NCCL enqueued them) and must be issued in the same order
/// on every rank. Dtypes: float32/64, float16, bfloat16, int32, int64, uint8 and bool (as
/// uint8: sum/avg/max are "or", product/min are "and"); avg on integers truncates.
class nccl_process_group : public collective_group {
 public:
  /// Bootstraps the communicator through `store` and starts the watchdog (Note [NCCL watchdog]).
  /// Blocks up to opts.timeout. Only opts.timeout and opts.check_fingerprints are used; with the
  /// latter the store must outlive the group. Throws:
  /// - bad_argument: rank outside [0, world_size), bad name;
  /// - device_mismatch: `device` is not a visible CUDA device;
  /// - cuda_failure, nccl_failure;
  /// - timeout: the unique id or a rank never came;
  /// - not_supported: a build without NCCL.
  nccl_process_group(store_client& store, int rank, int world_size, std::string name, troupe::device device,
                     process_group_options opts = {});
  /// The same bootstrap through a file_store (ranks on one host without a runtime node).
  nccl_process_group(const file_store& store, int rank, int world_size, std::string name, troupe::device device,
                     process_group_options opts = {});
  /// Waits (up to opts.timeout) for the collectives in flight, then finalizes and destroys the
  /// communicator; aborts it instead when they do not finish or it failed. Never throws.
  ~nccl_process_group() override;
  nccl_process_group(nccl_process_group&&) noexcept;
  nccl_process_group& operator=(nccl_process_group&&) noexcept;
  nccl_process_group(const nccl_process_group&) = delete;
  nccl_process_group& operator=(const nccl_process_group&) = delete;

  int rank() const noexcept override;
  int world_size() const noexcept override;
  const std::string& name() const noexcept override;
  /// The CUDA device of this rank.
  troupe::device device() const noexcept override;

  /// In place: every rank's `t` becomes op(t over all ranks). Every collective validates on the
  /// calling thread and throws:
  /// - bad_argument: undefined, non-contiguous, bad rank, unsupported dtype;
  /// - device_mismatch: not on this group's device;
  /// - shape_mismatch / dtype_mismatch: sizes or dtypes that do not fit;
  /// - invalid_state: the group was aborted;
  /// - nccl_failure: the launch failed, and the group is aborted;
  /// - timeout: the launch stayed in progress.
  work allreduce(tensor t, reduce_op op = reduce_op::sum) override;
  /// In place: every rank's `t` becomes `root`'s `t`.
  work broadcast(tensor t, int root) override;
  /// `output` (world_size * input.numel() elements, same dtype) receives every rank's `input`
  /// in rank order.
  work allgather(tensor output, tensor input) override;
  /// `output` receives block `rank` of op over every rank's `input` (world_size *
  /// output.numel() elements, same dtype).
  work reduce_scatter(tensor output, tensor input, reduce_op op = reduce_op::sum) override;
  /// Completes when every rank issued its barrier (an allreduce of one byte on the device).
  work barrier() override;
  /// Through the store (Note [NCCL fingerprints]): blocks until every rank arrived; timeout
  /// naming the ranks that did not; invalid_state when the group was aborted.
  void monitored_barrier(std::chrono::milliseconds timeout) override;
  /// zeros(shape, {dt, device()}).
  tensor make_buffer(shape_t shape, troupe::dtype dt) override;
  /// Names the next collective ("bucket 2") in its description, errors and recorder entry.
  void note_next(std::string note) override;
  /// Sends `t` to `dst` (!= rank). NCCL blocks the stream until `dst` receives: two ranks
  /// sending to each other must use batch_p2p.
  work send(tensor t, int dst);
  /// Receives into `t` from `src` (!= rank); the sender's dtype and count must match.
  work recv(tensor t, int src);
  /// Runs the sends and receives as one NCCL group (ncclGroupStart/End), so they progress
  /// together: exchanges between pairs, rings, and sends to self. bad_argument when empty.
  work batch_p2p(std::vector<p2p_op> ops);

  /// Aborts the communicator (ncclCommAbort): collectives in flight end with an error and every
  /// later call throws invalid_state naming `reason`. Idempotent; blocks only for the abort.
  void abort(const std::string& reason);
  /// Why the group is dead (the error that aborted it); nullopt while it is healthy.
  std::optional<troupe::error> failure() const;

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::ddp
