#pragma once
/// \file engine.hpp
/// The local backward engine. Note [Local backward]
/// ------------------------------------------------
///   roots (edge, grad) ──> graph_root ──> ... nodes ... ──> accumulate_grad (leaf .grad)
///                                                     └──> capture(edge, grad)  (engine::grad,
///                                                                                 dist autograd)
/// 1. Dependencies: count, for every node reachable from the roots, the edges pointing at it.
/// 2. Ready queue: a node is ready when all its dependencies delivered (gradients from several
///    edges into one input are summed in the node's input buffer). Among ready nodes the one
///    with the highest sequence number (created last) runs first, as PyTorch.
/// 3. Each node runs on the calling thread with grad mode off, holding its run mutex: tensor
///    hooks, pre-hooks, apply, post-hooks. Without retain_graph its saved tensors are freed.
/// 4. Captured edges: their summed gradient goes to the task's `capture` callback. When a task
///    names captured edges, only nodes on a path to one of them run; nothing else is touched.
/// Guarantees: every node runs at most once per pass, after all gradients into it are summed.
/// Failure: the first exception stops the pass and reaches the caller as a troupe::error whose
/// message names the node ("backward of mul: ..."); nodes already run keep their effects.
/// Thread safety: an engine holds no state between calls. Any number of threads may run
/// backward concurrently on the same or different engines. Graphs sharing nodes serialise on
/// each node's run mutex.

#include <functional>
#include <utility>
#include <vector>

#include "troupe/autograd/grad_node.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe {

/// One backward pass, the engine's lower-level entry (used by distributed autograd).
struct graph_task {
  /// Where the pass starts: each edge with the gradient flowing into it (undefined = none).
  std::vector<std::pair<edge, tensor>> roots;
  /// Keep saved tensors so the graph can be run again.
  bool retain_graph = false;
  /// Edges whose summed incoming gradient is handed to `capture`. When non-empty, only nodes on
  /// a path to a captured edge (or to a leaf, if capture_leaves) run.
  edge_list captured;
  /// Hand the gradient of every leaf's accumulate_grad to `capture` instead of running it
  /// (distributed autograd accumulates into its context, not .grad).
  bool capture_leaves = false;
  /// Receives (edge, gradient) for captured edges; may be called from the engine's thread only.
  std::function<void(const edge&, const tensor&)> capture;
};

/// The backward engine: a value the caller owns (no singleton, no state between calls).
class engine {
 public:
  /// Runs `task` to completion on the calling thread (blocks until done).
  /// Throws troupe::error naming the failing node.
  void execute(const graph_task& task) const;

  /// Accumulates the gradients of `roots` into the .grad of the leaves of their graph.
  /// `grad_roots` may be empty or hold undefined entries (ones for one-element roots).
  /// Throws:
  /// - autograd_error: a root does not require grad; an implicit gradient for a root with more
  ///   than one element; second backward without retain_graph;
  /// - shape_mismatch: grad_root's shape differs from its root's;
  /// - a backward formula's error.
  void backward(const tensor_list& roots, const tensor_list& grad_roots = {}, bool retain_graph = false) const;

  /// Returns the gradients of `outputs` w.r.t. `inputs` WITHOUT touching any .grad (only the
  /// nodes between them run). An input the outputs do not depend on gets an undefined tensor.
  /// Throws autograd_error if an input does not require grad; otherwise as backward.
  tensor_list grad(const tensor_list& outputs, const tensor_list& inputs, const tensor_list& grad_outputs = {},
                   bool retain_graph = false) const;
};

}  // namespace troupe
