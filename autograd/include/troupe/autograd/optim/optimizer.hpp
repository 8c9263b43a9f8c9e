#pragma once
/// \file optimizer.hpp
/// The optimizer base: the parameters it updates, their per-parameter state, its hyperparameters.
/// It steps in two ways: from each parameter's `.grad`, or functionally from explicit gradients.
/// The distributed optimizer passes gradients from a distributed autograd context.

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "troupe/autograd/nn/module.hpp"  // troupe::state_dict
#include "troupe/tensors/tensor.hpp"

namespace troupe::optim {

/// State of one parameter: the number of steps taken and named buffers (momentum_buffer,
/// exp_avg, exp_avg_sq), created lazily on the first step as in PyTorch.
struct param_state {
  double step = 0;
  std::map<std::string, tensor> buffers;
};

/// Base of sgd, adam, adamw. Updates run under no_grad, in place on the parameter tensors (the
/// handles stay the same, so modules and DDP see the new values). Not thread-safe.
class optimizer {
 public:
  /// Throws bad_argument for an empty list, an undefined or repeated parameter, or a parameter
  /// that does not require grad.
  explicit optimizer(tensor_list params);
  virtual ~optimizer() = default;
  optimizer(const optimizer&) = delete;
  optimizer& operator=(const optimizer&) = delete;

  /// One update from each parameter's `.grad`; parameters without a gradient are skipped.
  void step();
  /// The functional form: one update of params[i] with grads[i] (undefined grads skip the
  /// parameter); `.grad` is neither read nor written. Every params[i] must be one of this
  /// optimizer's parameters (bad_argument otherwise); shape_mismatch / dtype_mismatch /
  /// device_mismatch when a gradient does not match its parameter.
  void step(const tensor_list& params, const tensor_list& grads);
  /// Clears the `.grad` of every parameter.
  void zero_grad();

  /// Hyperparameters ("param_groups.0.lr", ... as float64 0-d tensors) and state
  /// ("state.<i>.step", "state.<i>.<buffer>") where i indexes params(). Buffers are shared, not
  /// copied.
  troupe::state_dict state_dict() const;
  /// Restores hyperparameters and state (buffers are copied). Validates first: a wrong index,
  /// shape, dtype or an unknown key throws (bad_argument / shape_mismatch / dtype_mismatch)
  /// and leaves the optimizer unchanged.
  void load_state_dict(const troupe::state_dict& sd);

  const tensor_list& params() const noexcept { return params_; }
  const param_state& state(std::size_t i) const { return state_.at(i); }
  double lr() const noexcept { return lr_; }
  void set_lr(double lr) { lr_ = lr; }

 protected:
  /// Updates `param` in place with gradient `grad` (same shape, dtype, device), using and
  /// updating `st`. Called under no_grad.
  virtual void update(tensor& param, const tensor& grad, param_state& st) = 0;
  /// The hyperparameters besides lr, by name, for state_dict (the pointers stay valid).
  virtual std::vector<std::pair<std::string, double*>> hyperparameters() = 0;
  /// Throws bad_argument naming `opt` when `value` is negative or not finite.
  static void check_non_negative(const char* opt, const char* name, double value);

  double lr_ = 1e-3;

 private:
  std::size_t index_of(const tensor& p) const;
  void apply(std::size_t i, const tensor& grad);

  tensor_list params_;
  std::vector<param_state> state_;
};

}  // namespace troupe::optim
