#pragma once
/// \file engine_steps.hpp
/// The steps every backward engine takes per node: run a node, hand its gradients to its next
/// edges, and the order in which ready nodes run. The local engine and the distributed FAST
/// engine of dist_autograd/ use them. Sharing them keeps error messages and CUDA stream
/// ordering (Note [Backward streams] in src/engine_steps.cpp) the same in every engine.

#include <unordered_map>
#include <vector>

#include "troupe/autograd/grad_node.hpp"

namespace troupe::engine_steps {

/// Pending edge count per node of one pass.
using dependency_counts = std::unordered_map<grad_node*, int>;
/// Gradients gathered so far per node input, per node of one pass.
using input_buffers = std::unordered_map<grad_node*, tensor_list>;

/// Runs `n`'s backward on `grads` under the node's run mutex (and, for CUDA, on the stream its
/// forward used). Blocks while another thread runs the same node. Throws troupe::error naming the
/// node (its own code, or autograd_error for other exceptions).
tensor_list run_node(grad_node& n, tensor_list&& grads);

/// Adds `out`, the gradients `n` returned, into the input buffers of `n`'s next edges. It orders
/// CUDA streams between producer and consumer. It appends every next node whose dependency
/// count reaches zero to `ready`. Throws autograd_error when `out` does not match the edges.
void deliver(grad_node& n, tensor_list&& out, input_buffers& buffers, dependency_counts& deps, std::vector<grad_node*>& ready);

/// Priority order of ready nodes: the most recently created (highest sequence number) first.
struct later_first {
  bool operator()(const grad_node* a, const grad_node* b) const { return a->sequence_nr() < b->sequence_nr(); }
};

}  // namespace troupe::engine_steps
