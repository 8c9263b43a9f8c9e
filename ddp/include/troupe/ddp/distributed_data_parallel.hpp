#pragma once
/// \file distributed_data_parallel.hpp
/// DistributedDataParallel: wraps a module so that backward averages the gradients over the
/// ranks of a process group, overlapping communication with backward. Design: Note [DDP
/// reducer] in reducer.hpp (buckets in reverse parameter order, one typed bucket actor per
/// bucket, allreduce launched strictly in bucket-index order, rebuild after the first iteration).

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "troupe/autograd/nn/module.hpp"
#include "troupe/ddp/collective_group.hpp"
#include "troupe/ddp/process_group.hpp"  // the CPU group most users pass

namespace troupe {
class node;
}

namespace troupe::ddp {

/// One bucket as a communication hook sees it.
struct grad_bucket {
  /// The bucket's index (launch order).
  int index = 0;
  /// The flat, contiguous gradients of the bucket (one dtype). The hook must leave the averaged
  /// gradients here once its work and `then` step completed.
  tensor buffer;
  /// The parameters whose gradients the buffer holds, and where each starts (elements).
  std::vector<tensor> parameters;
  std::vector<std::int64_t> offsets;
};

/// What a communication hook started: the work to wait for, and an optional step run after it
/// completed. The step runs on the thread finishing backward and leaves the averaged values in
/// the buffer.
struct comm_result {
  work pending;
  std::function<void()> then;
};

/// A communication hook: starts the reduction of one bucket. Runs on the bucket's actor (never
/// block in it); must issue the same collectives on every rank.
using comm_hook = std::function<comm_result(collective_group&, grad_bucket&)>;

/// The default hook: allreduce(avg) of the buffer in place.
comm_hook allreduce_hook();
/// Divides by the world size, casts to float16, allreduces (sum) and casts back.
comm_hook fp16_compress_hook();
/// As fp16_compress_hook with bfloat16.
comm_hook bf16_compress_hook();

/// Options of distributed_data_parallel (PyTorch's names and defaults).
struct ddp_options {
  /// Bucket size limit in MiB.
  double bucket_cap_mb = 25.0;
  /// Size limit of the first bucket (the gradients ready first), in MiB.
  double first_bucket_cap_mb = 1.0;
  /// Traverse the graph from the forward's outputs and mark parameters it does not reach as
  /// ready, so a branch not taken does not stall the reduction.
  bool find_unused_parameters = false;
  /// Broadcast rank 0's buffers before every forward.
  bool broadcast_buffers = true;
  /// Make every .grad a view into its bucket (saves the copy back; on CUDA too).
  bool gradient_as_bucket_view = false;
  /// Allocate the bucket buffers with the group's make_buffer (a shared-memory group: its shared
  /// arena, so their allreduce works in place, Note [shm zero copy]). No effect over TCP or NCCL.
  bool shared_buckets = true;
  /// Bound of every wait of the reducer (bucket launch, collective completion, bucket actors'
  /// exit).
  std::chrono::milliseconds timeout{60000};
  /// The runtime node whose actor system runs the bucket actors. The node's shutdown() stops
  /// them (Note [shutdown hooks]); the wrapper then refuses forward and backward with
  /// invalid_state, and may be destroyed after the node. Null: the wrapper runs them on a
  /// one-thread actor system of its own.
  troupe::node* node = nullptr;
};

/// When the steps of the last synchronised backward happened, in ms since prepare_for_backward
/// (the end of forward): shows whether the reductions overlapped the backward computation.
struct reduction_timeline {
  /// Per bucket index: when its reduction was launched, and when its collective finished.
  std::vector<double> launched_ms;
  std::vector<double> completed_ms;
  /// When the last gradient became ready (the backward computation ended).
  double last_grad_ms = 0;
  /// When the averaged gradients were in place (backward returns right after).
  double finished_ms = 0;
};

/// Data-parallel wrapper of a module over any collective_group (the CPU process groups and the
/// NCCL group). Not copyable, not movable (hooks refer to it); use from one thread. The module
/// and the group must outlive it.
class distributed_data_parallel {
 public:
  /// Parameters must be contiguous tensors on the group's device, else device_mismatch names
  /// the parameter and both devices. The device is the CPU for a process_group and the rank's
  /// CUDA device for an nccl_process_group (Note [DDP on CUDA] in grad_events.hpp). Parameters on
  /// one CUDA device over a CPU group are reduced through a host_staged_group on that device
  /// (Note [Host-staged collectives]); comm hooks then see that group.
  /// Checks that every rank has the same parameter names, shapes and dtypes. Otherwise it throws
  /// on every rank, naming the first difference and both ranks: bad_argument for names or
  /// counts, shape_mismatch, dtype_mismatch. Then it broadcasts rank 0's parameters and buffers,
  /// builds the buckets and registers one post-accumulate-grad hook per parameter. Blocks
  /// (collectives).
  distributed_data_parallel(std::shared_ptr<nn::unary_module> module, collective_group& group, ddp_options opts = {});
  /// The same for a module with several inputs (forward(tensor_list)).
  distributed_data_parallel(std::shared_ptr<nn::multi_input_module> module, collective_group& group, ddp_options opts = {});
  ~distributed_data_parallel();
  distributed_data_parallel(const distributed_data_parallel&) = delete;
  distributed_data_parallel& operator=(const distributed_data_parallel&) = delete;

  /// Runs the module. Before it:
  /// - checks that the previous backward reduced every parameter; else errc::autograd_error
  ///   names the parameters that got no gradient and tells to pass find_unused_parameters=true;
  /// - rebuilds the buckets once after the first iteration;
  /// - broadcasts buffers.
  /// After it: prepare_for_backward on the output. Blocks (collectives).
  tensor forward(const tensor& input);
  tensor operator()(const tensor& input) { return forward(input); }
  /// forward() with several inputs: a multi_input_module gets them all; a unary_module takes
  /// exactly one (bad_argument naming the count otherwise, before any collective).
  tensor forward(const tensor_list& inputs);
  tensor operator()(const tensor_list& inputs) { return forward(inputs); }
  /// Arms the reducer for the backward of `outputs` (forward() calls it; call it yourself after
  /// running the module in another way). With find_unused_parameters, marks the parameters not
  /// reachable from `outputs` ready.
  void prepare_for_backward(const tensor_list& outputs);

  /// The wrapped unary module; invalid_state when a multi_input_module is wrapped (see wrapped()).
  nn::unary_module& module() const;
  /// The wrapped module, of either kind.
  nn::module& wrapped() const;
  /// module().parameters()
  tensor_list parameters() const;
  /// Replaces the communication hook (the default is allreduce_hook()).
  void register_comm_hook(comm_hook hook);

  /// RAII guard: while alive, forward/backward accumulate gradients locally without reducing;
  /// the first synchronised backward after it reduces the accumulated sums.
  class no_sync_guard {
   public:
    explicit no_sync_guard(distributed_data_parallel& d);
    ~no_sync_guard();
    no_sync_guard(const no_sync_guard&) = delete;
    no_sync_guard& operator=(const no_sync_guard&) = delete;

   private:
    distributed_data_parallel& ddp_;
    bool previous_;
  };
  /// A no_sync_guard for this wrapper.
  [[nodiscard]] no_sync_guard no_sync() { return no_sync_guard(*this); }

  /// The buckets: indices into parameters(), bucket by bucket.
  std::vector<std::vector<std::size_t>> bucket_assignment() const;
  /// Parameter indices in the order they became ready during the last synchronised backward.
  std::vector<std::size_t> last_ready_order() const;
  /// Bucket indices in the order their reductions were launched during the last backward.
  std::vector<int> last_launch_order() const;
  /// The timeline of the last synchronised backward.
  reduction_timeline last_timeline() const;

  /// The step of the library's DDP fault points (Note [fault events]). It is the number of
  /// forward() calls so far, under no_sync too. So the n-th forward of every rank is step n
  /// (from 0). The
  /// forward point of a call, and the backward and allreduce points of the backward it armed,
  /// report the count before the call.
  std::int64_t step() const;
  /// Sets the count, for a job resumed at step `s` (from a checkpoint): the next forward is step s.
  /// bad_argument when s is negative.
  void set_step(std::int64_t s);

  struct impl;

 private:
  /// The constructors' common part: checks, state broadcast, buckets, hooks.
  void setup();
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::ddp
