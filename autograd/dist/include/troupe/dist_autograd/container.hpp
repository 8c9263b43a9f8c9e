#pragma once
/// \file container.hpp
/// Distributed autograd contexts (FAST mode), first slice.
///
///   troupe::dist_autograd::container dist(n);          // one per node, owned by the caller
///   {
///     troupe::dist_autograd::context ctx(dist);
///     auto msg = dist.record_send(ctx.id(), {x}, "worker1");
///     auto [m2, y] = troupe::rpc_sync<std::tuple<std::uint64_t, tensor>>(n, "worker1", "fwd", ctx.id(), msg, x);
///     tensor y2 = dist.record_recv(ctx.id(), m2, "worker1", {y})[0];
///     dist.backward(ctx.id(), {sum(y2)});
///     auto g = dist.get_gradients(ctx.id());           // leaf -> gradient, this worker only
///   }                                                   // released on every worker involved
///
/// Note [dist backward, this slice]
/// - The RPC layer does not yet record send/recv functions by itself (the interception
///   interface is not wired into the codec): the caller records them with record_send /
///   record_recv on both ends, passing the context and message ids in the call.
/// - backward runs the local engine from the roots with leaf capture (gradients go into the
///   context, never into .grad). A recv_function's backward sends PropagateGradients
///   (`__troupe_dist_autograd_propagate`) to the sender asynchronously and records the future
///   in the context; the sender's handler runs the matching send_function's subgraph the same
///   way and waits for the propagations it started itself before answering. backward returns
///   when all futures it (transitively) waited for completed; the first error (the remote text,
///   or peer_lost / timeout from the RPC future) is rethrown after all were waited for.
/// - Each propagation runs its send function's subgraph as a separate engine pass: when two
///   send functions of one worker share an intermediate node, that node runs once per pass.
///   Dependencies across send functions (the design's first-time computation) are not done yet.
/// - Release: ~context (or release()) drops the local state and sends
///   `__troupe_dist_autograd_release` to every worker this context exchanged tensors with, up to
///   3 attempts each; a worker forwards it to its own peers. Unknown ids are ignored (idempotent).

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/node.hpp"
#include "troupe/dist_autograd/functions.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe::dist_autograd {

/// The gradients a context accumulated on one worker: leaf -> gradient.
class gradient_map {
 public:
  /// The gradient of `leaf`; throws troupe::error(bad_argument) if it has none here.
  tensor at(const tensor& leaf) const;
  /// Whether `leaf` has a gradient here.
  bool contains(const tensor& leaf) const;
  std::size_t size() const noexcept { return entries_.size(); }
  /// Adds `grad` to the entry of `leaf` (creates it on first use).
  void accumulate(const tensor& leaf, const tensor& grad);

 private:
  std::map<const void*, std::pair<tensor, tensor>> entries_;  // key: the leaf's autograd metadata
};

class container;

/// RAII: a new context on `c` for this object's lifetime; released on every worker at the end.
class context {
 public:
  explicit context(container& c);
  ~context();
  context(const context&) = delete;
  context& operator=(const context&) = delete;
  /// The globally unique id of this context.
  context_id id() const noexcept { return id_; }

 private:
  container& c_;
  context_id id_;
};

/// The distributed autograd state of one worker: its contexts, by id. Attach one per node (it
/// registers the reserved functions on the node); it must outlive calls made through it.
class container {
 public:
  /// Registers `__troupe_dist_autograd_propagate` and `__troupe_dist_autograd_release` on `n`.
  explicit container(node& n);
  ~container();
  container(const container&) = delete;
  container& operator=(const container&) = delete;

  /// Creates a context with a new globally unique id (worker rank << 48 | counter).
  context_id create_context();
  /// Drops the context here and on every worker it exchanged tensors with (best effort,
  /// bounded, idempotent). Unknown ids are ignored.
  void release(context_id id);
  /// Number of live contexts on this worker (for leak checks).
  std::size_t num_contexts() const;

  /// Sender side: records a send_function for `tensors` sent to `to`; returns its message id
  /// (pass it to the receiver). Throws bad_argument for an unknown context.
  message_id record_send(context_id ctx, const tensor_list& tensors, const std::string& to);
  /// Receiver side: records a recv_function for tensors that came from `from` under
  /// (ctx, msg) and returns them with it as grad_fn (floating tensors only). Creates the
  /// context here if this worker has not seen it yet.
  tensor_list record_recv(context_id ctx, message_id msg, const std::string& from, const tensor_list& tensors);

  /// Runs the distributed backward of `roots` (local tensors of one element each, gradient 1)
  /// in context `ctx`; returns when every worker's part finished. Throws autograd_error for a
  /// root that does not require grad or has more than one element, bad_argument for an
  /// unknown context, or the first error of any worker (remote_exception with the remote text,
  /// peer_lost, timeout).
  void backward(context_id ctx, const tensor_list& roots, bool retain_graph = false);
  /// The gradients accumulated in `ctx` on this worker (a copy).
  gradient_map get_gradients(context_id ctx) const;

  struct impl;

 private:
  std::shared_ptr<impl> impl_;
};

}  // namespace troupe::dist_autograd
