#pragma once
// The distributed engine, FAST mode (Note [FAST mode backward]).
//
// Note [FAST mode backward]
// A backward pass has an id (pass = a new id of the worker that holds the roots); every
// PropagateGradients carries it. A worker first runs something of a pass for a context in
// backward() on the root worker, and in the first propagation that arrives on the others. Then
// it computes the dependencies of the context once, from the roots (if here) and ALL send
// functions of the context. It keeps them with the input buffers in the context (graph_pass).
// Each later entry, a propagation running its send function, feeds the same counters. So a node
// shared by the subgraphs of two send functions runs once, after the gradients of both arrived,
// exactly as the local engine would run it.
//
//   worker0                          worker1 (first propagation of pass p: computes deps)
//   backward: deps(roots + sends)    send_a ──┐
//   recv_b ──PropagateGradients(p)──>         ├─> shared node (deps 2) ─> acc(w) -> context grads
//   recv_c ──PropagateGradients(p)──> send_b ─┘
//
// Runs of one context on one worker are serialised (context_state::run). A leaf's gradient goes
// into the context; the leaf's tensor hooks run first, and .grad is never touched. Recv
// functions hand a PropagateGradients to their sender to the context actor, which sends it at
// once. They count it in the run's outbox. The run's caller tells the actor the count, and the
// actor retries and awaits them. The root's backward waits for its answer, bounded. A worker
// serving a propagation answers through its service's response promise. So the root's backward
// returns only when every worker's part finished (Note [context actor]).
// Limitation (as in PyTorch's FAST mode): a node that depends on a send function whose
// gradients never arrive in the pass (its tensor was not used) never runs.
// A new pass (retain_graph) recomputes the dependencies; buffers of the previous pass are dropped.

#include <memory>
#include <vector>

#include "container_impl.hpp"

namespace troupe::dist_autograd {

/// An engine run, handed to the recv functions it runs (recv_function::bind_run).
struct run_info {
  context_id ctx = 0;
  std::uint64_t pass = 0;
  bool retain = false;
  propagation_outbox* outbox = nullptr;  ///< where recv functions count the propagations they started
};

/// Runs `entry` with `inputs` as part of pass `pass` of `ctx`. `entry` is a graph_root on the
/// root worker, a send function elsewhere. It computes the pass's dependencies first if this
/// worker has not seen it. Recv functions start their propagations and count them in `outbox`;
/// the context actor retries and awaits them, and this run does not wait for them. Blocks the
/// calling thread for the local work only; throws the first node error (troupe::error naming
/// the node).
void execute_fast(context_state& ctx, std::uint64_t pass, bool retain, const std::shared_ptr<grad_node>& entry,
                  tensor_list inputs, propagation_outbox& outbox);

}  // namespace troupe::dist_autograd
