#pragma once
/// \file autograd_hook.hpp
/// The seam between the tensor library and the autograd layer. The tensors layer knows nothing
/// of graphs or engines. Every differentiable op describes itself as an `op_record`: inputs,
/// outputs, saved tensors and a backward formula written with tensor ops. It hands the record to
/// the autograd metadata of its first input that requires grad. The autograd layer implements
/// `autograd_meta_interface` and turns records into graph nodes.
///
/// Note [Op recording]
/// -------------------
///   op(a, b) -> out                         tensors layer
///     if grad_mode::is_enabled() and any input requires grad:
///       record_op({name, {a,b}, {out}, saved, backward})
///         -> a.autograd_meta()->record(rec)  autograd layer: makes a node whose next edges
///                                            are the inputs' (grad_fn, output_nr) or their
///                                            AccumulateGrad, and gives `out` metadata
///                                            (grad_fn = node, output_nr = i)
/// The engine calls the backward formula with grad mode disabled. The formula receives the
/// saved tensors, after the autograd layer checked their versions, and the output gradients.
/// It returns one gradient per input. A gradient is undefined where needs_input_grad is false
/// or there is none.
/// In-place ops record with `in_place = true` and outputs = {self}: the autograd layer rebases
/// self's history onto the new node.

#include <functional>
#include <string>
#include <vector>

#include "troupe/tensors/tensor.hpp"

namespace troupe {

/// Everything a backward formula may read.
struct backward_ctx {
  /// The tensors the op saved, in the order it saved them (version-checked, no history).
  const tensor_list& saved;
  /// Gradient of each output (undefined if that output received none: treat as zeros).
  const tensor_list& grad_outputs;
  /// Whether input i needs a gradient.
  const std::vector<bool>& needs_input_grad;
};

/// A backward formula: returns one gradient per input of the op.
using backward_fn = std::function<tensor_list(const backward_ctx&)>;

/// The description of one differentiable op application.
struct op_record {
  std::string name;       ///< op name, used in error messages ("matmul")
  tensor_list inputs;     ///< the op's tensor inputs, in order (undefined allowed)
  tensor_list outputs;    ///< the op's outputs
  tensor_list saved;      ///< tensors the backward reads
  backward_fn backward;
  bool in_place = false;  ///< outputs == {inputs[0]}, modified in place
};

/// Autograd metadata attached to a tensor; implemented by the autograd layer.
class autograd_meta_interface {
 public:
  virtual ~autograd_meta_interface() = default;
  virtual bool requires_grad() const = 0;
  /// Turns `rec` into a graph node and attaches metadata to its outputs.
  /// Throws troupe::error(autograd_error) for illegal cases (in-place on a leaf requiring grad).
  virtual void record(op_record&& rec) const = 0;
  /// Throws troupe::error (autograd_error / not_supported) if the in-place op `op` on `self` is
  /// illegal (a leaf that requires grad, a view of a tensor that requires grad). Called by
  /// in-place ops BEFORE they write, so a refused op leaves the data untouched.
  virtual void check_in_place(const tensor& /*self*/, const std::string& /*op*/) const {}
};

/// Thread-local switch for recording (like torch.is_grad_enabled()).
struct grad_mode {
  static bool is_enabled() noexcept;
  static void set_enabled(bool on) noexcept;
};

/// RAII: disables recording on this thread for its lifetime (torch.no_grad()).
class no_grad_guard {
 public:
  no_grad_guard() : prev_(grad_mode::is_enabled()) { grad_mode::set_enabled(false); }
  ~no_grad_guard() { grad_mode::set_enabled(prev_); }
  no_grad_guard(const no_grad_guard&) = delete;
  no_grad_guard& operator=(const no_grad_guard&) = delete;
 private:
  bool prev_;
};

/// RAII: enables recording on this thread for its lifetime (torch.enable_grad()).
class enable_grad_guard {
 public:
  enable_grad_guard() : prev_(grad_mode::is_enabled()) { grad_mode::set_enabled(true); }
  ~enable_grad_guard() { grad_mode::set_enabled(prev_); }
  enable_grad_guard(const enable_grad_guard&) = delete;
  enable_grad_guard& operator=(const enable_grad_guard&) = delete;
 private:
  bool prev_;
};

/// True when grad mode is on and any of `inputs` requires grad.
bool should_record(std::initializer_list<const tensor*> inputs);
bool should_record(const tensor_list& inputs);
/// Hands `rec` to the metadata of the first input that requires grad.
void record_op(op_record&& rec);
/// Checks that autograd allows the in-place op `op` to write into `self`, with `others` as
/// further inputs; call it before the write. A no-op when grad mode is off or no tensor involved
/// has autograd metadata. Throws what autograd_meta_interface::check_in_place throws.
void check_in_place(const tensor& self, std::initializer_list<const tensor*> others, const char* op);

}  // namespace troupe
