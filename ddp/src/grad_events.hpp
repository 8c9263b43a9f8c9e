#pragma once
// Stream order of DDP on CUDA: each bucket's reduction starts after the copies of its gradients.
//
// Note [DDP on CUDA]
// ------------------
// Parameters, buckets and the group (nccl_process_group, or a host_staged_group over a CPU
// group) live on one CUDA device.
//
//   backward thread, current stream:  grad(p) -> copy into bucket view -> record ev[p]
//   bucket actor thread, current stream:                wait ev[p] for p in bucket b
//                                                       [comm hook kernels: fp16/bf16 casts]
//   group's NCCL stream:                                  wait ready -> allreduce b -> done
//   backward thread (finalize):  work::wait (host polls done) -> current stream waits on done
//                                -> then-step, copy back to .grad (or .grad is a bucket view)
//   optimizer (same thread, same current stream): runs after the copy back
//
// - Each parameter owns one event. It is recorded on the backward thread's current stream after
//   its gradient was copied into the bucket. So it comes after the stream that produced the
//   gradient, which the autograd engine orders before the hook.
// - The bucket actor makes its own current stream wait on the events of its bucket before the
//   hook runs. The group then orders its stream after that stream (Note [NCCL process group]).
//   A host_staged_group instead copies the bucket to the host on that stream and waits for the
//   copy (Note [Host-staged collectives]). The copy back runs on the backward thread's stream in
//   work::wait.
// - The averaged gradients are in place on the backward thread's current stream when backward
//   returns; the host has seen every collective complete.
// On a CPU group every call here is a no-op.

#include <cstddef>
#include <vector>

#include "troupe/tensors/device.hpp"

#if defined(TROUPE_WITH_CUDA)
#include "troupe/tensors/cuda.hpp"
#endif

namespace troupe::ddp::detail {

/// One CUDA event per parameter (Note [DDP on CUDA]); nothing on CPU. Not thread-safe: record
/// runs on the backward thread, wait on the bucket actor after the record (message order).
class grad_events {
 public:
  /// Makes `n` events on `d` (none when `d` is cpu). Throws cuda_failure.
  void reset(troupe::device d, std::size_t n);
  /// Records parameter `i`'s event on the calling thread's current stream. Never blocks.
  void record(std::size_t i);
  /// Makes the calling thread's current stream wait for the events of `params`. Never blocks.
  void wait(const std::vector<std::size_t>& params) const;

 private:
  troupe::device dev_{};
#if defined(TROUPE_WITH_CUDA)
  std::vector<cuda::event> events_;
#endif
};

}  // namespace troupe::ddp::detail
