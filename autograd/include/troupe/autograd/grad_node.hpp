#pragma once
/// \file grad_node.hpp
/// Nodes of the backward graph. A node takes the gradients of its forward op's outputs and
/// returns the gradients of the forward op's inputs; `next_edges()[i]` says where gradient i
/// flows. Kinds:
/// - `op_node`: an op recorded by the tensors layer;
/// - `accumulate_grad`: the sink of a leaf that requires grad;
/// - `graph_root`: the engine's start;
/// - user and distributed nodes derived from `node` (send/recv functions of distributed autograd).
///
/// Note [Backward streams]
/// ------------------------
/// A node recorded while its inputs were CUDA tensors remembers the current stream of their
/// device at that moment. The engine makes that stream current while the node runs. So the
/// backward kernels are ordered after the forward ones on the same stream (PyTorch's rule).
/// A gradient produced on one stream may be consumed by a node of another stream. Then the
/// engine records an event on the producer's stream. The consumer's stream waits on it before
/// the gradient is accumulated there (engine.cpp, order_streams):
///
///   producer (stream A) --grad--> [event on A; B waits] --> buffer add on B --> consumer (B)
///
/// CPU builds compile none of this.
///
/// Naming follows PyTorch: a node's *inputs* are gradients w.r.t. its forward op's outputs
/// ("grad_outputs"); what `apply` returns are gradients w.r.t. the forward op's inputs
/// ("grad_inputs").

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/autograd/hook_handle.hpp"
#include "troupe/autograd/saved_variable.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe {

class grad_node;

/// One gradient flow: into the `input_nr`-th gradient input of `fn`. Invalid when fn is null
/// (the forward input did not require grad).
struct edge {
  std::shared_ptr<grad_node> fn;
  std::uint32_t input_nr = 0;
  bool valid() const noexcept { return fn != nullptr; }
  friend bool operator==(const edge& a, const edge& b) noexcept {
    return a.fn == b.fn && a.input_nr == b.input_nr;
  }
};
using edge_list = std::vector<edge>;

/// A tensor hook: sees a gradient; returns a replacement, or an undefined tensor to keep it.
using tensor_hook = std::function<tensor(const tensor&)>;
/// A node pre-hook: may modify the incoming gradients before `apply`.
using node_pre_hook = std::function<void(tensor_list& grad_outputs)>;
/// A node post-hook: sees the gradients `apply` returned and the ones it received.
using node_post_hook = std::function<void(const tensor_list& grad_inputs, const tensor_list& grad_outputs)>;

/// Shape, dtype and device of a forward input, to validate the gradient returned for it.
struct input_info {
  bool defined = false;
  shape_t shape;
  troupe::dtype dtype = troupe::dtype::float32;
  troupe::device device = cpu_device;
};

/// A backward-graph node. Created and owned through std::shared_ptr (hook handles and edges
/// refer to it). The engine runs a node on the thread that called backward, holding
/// `run_mutex()`, so a node never runs concurrently with itself.
class grad_node : public std::enable_shared_from_this<grad_node> {
 public:
  /// `num_inputs`: how many gradients the node takes (its forward op's outputs).
  /// The sequence number comes from a per-thread counter (as PyTorch's): later nodes get higher
  /// numbers and run first among ready nodes.
  grad_node(std::string name, edge_list next_edges, std::uint32_t num_inputs);
  /// As above with an explicit sequence number (accumulate_grad uses the maximum).
  grad_node(std::string name, edge_list next_edges, std::uint32_t num_inputs, std::uint64_t sequence_nr);
  /// Releases the chain of nodes only this node keeps alive iteratively (a graph of a million
  /// chained ops would overflow the stack with recursive shared_ptr destruction).
  virtual ~grad_node();
  grad_node(const grad_node&) = delete;
  grad_node& operator=(const grad_node&) = delete;

  /// The op's name ("mul", "accumulate_grad"), used in every error message.
  const std::string& name() const noexcept { return name_; }
  /// Higher = created later = runs earlier when several nodes are ready.
  std::uint64_t sequence_nr() const noexcept { return sequence_nr_; }
  /// Where each returned gradient flows (one edge per forward input; invalid edges get none).
  const edge_list& next_edges() const noexcept { return next_edges_; }
  /// Replaces the next edges (distributed autograd wires its recv functions this way).
  void set_next_edges(edge_list e) { next_edges_ = std::move(e); }
  /// Number of gradients the node takes.
  std::uint32_t num_inputs() const noexcept { return num_inputs_; }

  /// The backward computation: one gradient per next edge (undefined = no gradient).
  /// Runs with grad mode disabled. May throw; the engine reports the node's name.
  virtual tensor_list apply(tensor_list&& grads) = 0;
  /// Frees saved tensors after a backward without retain_graph (default: nothing to free).
  virtual void release_variables() {}

  /// Runs the hooks around `apply`: tensor hooks per input, retains-grad hooks, pre-hooks,
  /// apply, post-hooks. The engine calls this while holding `run_mutex()`.
  tensor_list run(tensor_list&& grads);

  /// Registers a hook that may modify the incoming gradients before `apply`.
  hook_handle register_pre_hook(node_pre_hook fn);
  /// Registers a hook called after `apply` with (grad_inputs, grad_outputs).
  hook_handle register_post_hook(node_post_hook fn);
  /// Registers a hook on gradient input `input_nr` (register_hook on a non-leaf tensor).
  hook_handle register_tensor_pre_hook(std::uint32_t input_nr, tensor_hook fn);
  /// Sets the hook that stores gradient input `input_nr` into a tensor's .grad (retain_grad);
  /// it runs after the tensor hooks. At most one per input.
  void set_retains_grad_hook(std::uint32_t input_nr, std::function<void(const tensor&)> fn);

  /// Held by the engine while the node runs.
  std::mutex& run_mutex() noexcept { return run_mutex_; }

  // ---- CUDA (Note [Backward streams]) ------------------------------------------------------
  /// Remembers the stream the forward op ran on (the current stream of `device` at recording).
  void set_forward_stream(int device, void* stream) noexcept {
    forward_device_ = device;
    forward_stream_ = stream;
  }
  /// The CUDA device of the forward op, or -1 when its inputs were not CUDA tensors.
  int forward_device() const noexcept { return forward_device_; }
  /// The forward op's stream on forward_device() (nullptr: the default stream).
  void* forward_stream() const noexcept { return forward_stream_; }

 private:
  struct tensor_pre_hook {
    std::uint64_t id;
    std::uint32_t input_nr;
    tensor_hook fn;
  };
  template <class Hook> struct keyed { std::uint64_t id; Hook fn; };

  void apply_tensor_hooks(tensor_list& grads);

  std::string name_;
  edge_list next_edges_;
  std::uint32_t num_inputs_;
  std::uint64_t sequence_nr_;
  std::mutex run_mutex_;
  int forward_device_ = -1;
  void* forward_stream_ = nullptr;
  // Hooks may be registered from another thread than the one running backward.
  std::mutex hooks_mutex_;
  std::uint64_t next_hook_id_ = 0;
  std::vector<tensor_pre_hook> tensor_pre_hooks_;
  std::vector<std::pair<std::uint32_t, std::function<void(const tensor&)>>> retains_grad_hooks_;
  std::vector<keyed<node_pre_hook>> pre_hooks_;
  std::vector<keyed<node_post_hook>> post_hooks_;
};

/// The node of one recorded op (an `op_record` of the tensors layer).
class op_node final : public grad_node {
 public:
  /// `inputs` describe the forward inputs (one per next edge); `num_outputs` the op's outputs.
  op_node(op_record&& rec, edge_list next_edges, std::vector<input_info> inputs);

  /// Unpacks and version-checks the saved tensors, calls the op's backward formula and checks
  /// that each gradient matches its input's shape (casting to the input's dtype).
  /// Throws autograd_error: second backward after the saved tensors were freed; a saved tensor
  /// modified in place; a formula returning the wrong number or shape of gradients.
  tensor_list apply(tensor_list&& grads) override;
  void release_variables() override;

 private:
  tensor_list validate(tensor_list&& grads) const;

  backward_fn backward_;
  std::vector<saved_variable> saved_;
  std::vector<input_info> inputs_;
  std::vector<bool> needs_input_grad_;
  bool released_ = false;
};

/// The sink of a leaf that requires grad. It runs the leaf's tensor hooks, then accumulates into
/// its .grad, then runs its post-accumulate-grad hooks. The first gradient becomes a detached
/// clone; later ones are added in place under no_grad. All uses of a leaf in live graphs share
/// one accumulate_grad.
class accumulate_grad final : public grad_node {
 public:
  explicit accumulate_grad(tensor leaf);
  tensor_list apply(tensor_list&& grads) override;
  /// The leaf this node accumulates into.
  const tensor& variable() const noexcept { return variable_; }

 private:
  tensor variable_;
};

/// The engine's start node: returns the root gradients, one per root edge.
class graph_root final : public grad_node {
 public:
  graph_root(edge_list roots, tensor_list grads);
  tensor_list apply(tensor_list&& grads) override;

 private:
  tensor_list grads_;
};

}  // namespace troupe
