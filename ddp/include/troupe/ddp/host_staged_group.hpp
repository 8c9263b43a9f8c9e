#pragma once
/// \file host_staged_group.hpp
/// A collective_group on a CUDA device over a CPU group (shared-memory or TCP `process_group`):
/// every collective stages its device tensors through host memory.
///
/// Note [Host-staged collectives]
/// ------------------------------
/// The CPU groups reduce host tensors only. `host_staged_group` gives them a CUDA face:
///
///   caller's thread, its current stream S:  t (device) --D2H on S, host waits--> h (host)
///   CPU group's worker:                     collective on h (fingerprints, failures as usual)
///   thread calling work::wait():            wait CPU work -> h --H2D on its current stream--> t
///
/// - The D2H copy runs on the calling thread's current stream of the device. The host waits for
///   it, so the collective sees everything enqueued on that stream before the call. DDP orders
///   that stream after its gradient events (Note [DDP on CUDA]).
/// - The result reaches the device tensor when the work is waited for. `wait()` or
///   `synchronize_stream()` copies it once, on the waiting thread's current stream. So later work
///   on that stream sees it. `is_completed()` only says the CPU collective finished.
/// - Host copies go through the tensor library's pinned staging (Note [Pinned staging]).
/// - Errors of the CPU group (peer_lost, collective_mismatch, timeout) come through the work
///   unchanged; a device tensor on another device or on the CPU is refused with device_mismatch.

#include <memory>
#include <string>

#include "troupe/ddp/collective_group.hpp"

namespace troupe::ddp {

/// Runs the collectives of a CPU `collective_group` on tensors of one CUDA device
/// (Note [Host-staged collectives]). The inner group must outlive it. Not copyable or movable;
/// collectives may be issued from any thread, in the same order on every rank.
class host_staged_group final : public collective_group {
 public:
  /// `inner` must be a CPU group (device_mismatch otherwise) and `dev` a CUDA device
  /// (device_mismatch for cpu).
  host_staged_group(collective_group& inner, troupe::device dev);
  host_staged_group(const host_staged_group&) = delete;
  host_staged_group& operator=(const host_staged_group&) = delete;

  int rank() const noexcept override { return inner_.rank(); }
  int world_size() const noexcept override { return inner_.world_size(); }
  const std::string& name() const noexcept override { return inner_.name(); }
  /// The CUDA device given at construction.
  troupe::device device() const noexcept override { return dev_; }

  work allreduce(tensor t, reduce_op op = reduce_op::sum) override;
  work broadcast(tensor t, int root) override;
  work allgather(tensor output, tensor input) override;
  work reduce_scatter(tensor output, tensor input, reduce_op op = reduce_op::sum) override;
  work barrier() override { return inner_.barrier(); }
  void monitored_barrier(std::chrono::milliseconds timeout) override { inner_.monitored_barrier(timeout); }
  /// Zeros on the device (the staging buffers are the CPU group's).
  tensor make_buffer(shape_t shape, troupe::dtype dt) override;
  void note_next(std::string note) override { inner_.note_next(std::move(note)); }

 private:
  /// A host copy of `t` (device -> host on the caller's current stream, waited for).
  tensor stage_in(const tensor& t, const char* what) const;
  /// A work that completes with `cpu_work` and then copies `host` into `out` once.
  static work staged(work cpu_work, tensor out, tensor host);

  collective_group& inner_;
  troupe::device dev_;
};

}  // namespace troupe::ddp
