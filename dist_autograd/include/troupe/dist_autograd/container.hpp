#pragma once
/// \file container.hpp
/// Distributed autograd contexts (FAST mode).
///
///   troupe::dist_autograd::add_message_types(opts);    // every process, before its node starts
///   troupe::node n(opts);
///   troupe::dist_autograd::container dist(n);          // one per node, owned by the caller
///   {
///     troupe::dist_autograd::context ctx(dist);        // current on this thread until its end
///     tensor y = troupe::rpc_sync<tensor>(n, "worker1", "fwd", x);  // send/recv recorded
///     dist.backward(ctx.id(), {sum(y)});
///     auto g = dist.get_gradients(ctx.id());           // leaf -> gradient, this worker only
///   }                                                   // released on every worker involved
///
/// Note [dist autograd recording]
/// The container installs a call interceptor on its node (Note [call interceptor]). While a
/// context is current on the calling thread, every RPC carries meta bytes. RPCs are rpc_sync /
/// rpc_async, remote, RRef methods and to_here. The meta bytes are the context id, message id,
/// sender, and one requires-grad flag per tensor of the payload. When a tensor of the payload
/// requires grad, the sender records a send_function and the receiver a recv_function under
/// (context id, message id). The same holds for the response. A served call runs with the
/// caller's context current, so RPCs the callee makes propagate it. A worker that sees a context
/// id for the first time creates the context. It remembers the caller as a worker involved, and
/// the caller remembers the callee.
///
///   worker0 (ctx current)                          worker1
///   rpc(x) --meta{ctx, m1, worker0, [1]}----------> recv_fn m1 = grad_fn(x')   [ctx current]
///          send_fn m1 -> edge(x)                    y = f(x')
///   recv_fn m2 = grad_fn(y') <----meta{ctx, m2, worker1, [1]}-- send_fn m2 -> edge(y)
///
/// Note [FAST mode backward] is in fast_engine.hpp (private). Each context on each worker is a
/// CAF actor owning the context's record (Note [context actor], src/context_actor.hpp). The
/// context actors exchange typed messages with their peers' service actors, published as
/// "troupe.dist_autograd.service" (Note [dist autograd service], src/service.hpp). Release:
/// ~context (or release()) drops the context here and sends a release_request to every worker
/// involved, in parallel. One that times out is retried by a context actor with backoff. ~context
/// does not wait for the answers; release() does. A worker forwards it to its own peers. Unknown
/// ids are ignored. A released id is remembered for a while, so a late message does not recreate
/// it (idempotent). Destroy the container before its node
/// shuts down (it stops its actors).

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/node.hpp"
#include "troupe/actors/rpc/interceptor.hpp"
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

/// Timeouts and retries of the container's control messages.
struct container_options {
  /// Deadline of one PropagateGradients attempt (a lost one is retried after it).
  std::chrono::milliseconds propagate_timeout{10000};
  /// Deadline of one release attempt, and of the lookup of a peer's service actor.
  std::chrono::milliseconds release_timeout{2000};
  /// Attempts per control message (propagate, release) before giving up.
  int attempts = 4;
  /// Backoff before the second attempt; doubles on each later one.
  std::chrono::milliseconds backoff{20};
  /// Bound on one propagation including the nested work it waits for (polls included).
  std::chrono::milliseconds backward_timeout{60000};
};

class container;

/// Announces the message types of distributed autograd (Note [dist autograd service]) in `opts`.
/// Call it on every process that attaches a container, before its node starts. Never blocks.
void add_message_types(node_options& opts);

/// RAII: a new context on `c`, current on this thread for this object's lifetime (RPCs made
/// meanwhile are recorded in it). The destructor drops it here at once and sends its release to
/// every worker involved without waiting for their answers, as PyTorch's cleanup does
/// (container::await_releases waits for them). Create and destroy it on the same thread.
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
  const void* previous_owner_;
  context_id previous_;
};

/// The distributed autograd state of one worker: its contexts, by id. Attach one per node (it
/// publishes its service actor and installs the call interceptor on the node); it must outlive
/// calls made through it.
class container {
 public:
  /// Spawns and publishes the service actor, registers the optimizer's reserved functions and
  /// installs the interceptor on `n`. Blocks on one store round trip. Throws troupe::error:
  /// invalid_state when add_message_types was not applied to `n`'s options, or `n` has no direct
  /// channel (node_options::direct_channel); peer_lost when the store host is gone.
  explicit container(node& n, container_options opts = {});
  ~container();
  container(const container&) = delete;
  container& operator=(const container&) = delete;

  /// Creates a context with a new globally unique id (worker rank << 48 | counter). It is not
  /// made current (context does that).
  context_id create_context();
  /// Drops the context here and on every worker involved (bounded, idempotent, retried). Unknown
  /// ids are ignored. Blocks until the workers answered, up to attempts × release_timeout per hop.
  void release(context_id id);
  /// Blocks, at most `timeout`, until every release a `context` of this container started has
  /// ended. A release ends when each worker involved answered it, or when it was given up (a
  /// lost or refusing peer, or `attempts` timeouts). True when none is left. ~context itself does not wait.
  bool await_releases(std::chrono::milliseconds timeout);
  /// Number of live contexts on this worker (for leak checks).
  std::size_t num_contexts() const;
  /// The context current on this thread for this container (0: none).
  context_id current_context() const;

  /// Runs the distributed backward of `roots` (local one-element tensors, gradient 1) in context
  /// `ctx`; returns when every worker's part and every propagation finished. Throws:
  /// - autograd_error for a root that does not require grad or has more than one element;
  /// - bad_argument for an unknown context;
  /// - the first error of any worker: remote_exception with the remote text, peer_lost naming
  ///   the worker, timeout.
  /// A failed backward releases the context on the other workers; the local one stays until
  /// the context ends. Reports the fault point "backward" at step n for its n-th call on this
  /// container (Note [fault events]).
  void backward(context_id ctx, const tensor_list& roots, bool retain_graph = false);
  /// The gradients accumulated in `ctx` on this worker (a copy). Throws bad_argument for an
  /// unknown context.
  gradient_map get_gradients(context_id ctx) const;

  /// The node this container is attached to.
  node& this_node() noexcept;
  /// The call interceptor the container installed on its node (the same object each time); a
  /// runtime or a test may drive it by hand (Note [call interceptor]).
  std::shared_ptr<rpc::call_interceptor> interceptor() const;

  struct impl;

 private:
  friend class context;
  friend struct container_access;  // the library's other parts (optimizer.cpp)
  std::shared_ptr<impl> impl_;
};

}  // namespace troupe::dist_autograd
