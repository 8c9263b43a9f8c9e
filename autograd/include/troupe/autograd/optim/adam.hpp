#pragma once
/// \file adam.hpp
/// Adam and AdamW (torch.optim.Adam / AdamW, without amsgrad).

#include "troupe/autograd/optim/optimizer.hpp"

namespace troupe::optim {

/// Adam/AdamW hyperparameters. weight_decay defaults to 0 for adam; adamw's own default is 1e-2
/// (see adamw_options()).
struct adam_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
};

/// AdamW's defaults: adam_options with weight_decay = 1e-2.
inline adam_options adamw_options() {
  adam_options o;
  o.weight_decay = 1e-2;
  return o;
}

/// PyTorch's Adam, per parameter p with gradient g, step t (counted from 1):
///   g = g + weight_decay * p                      (adam: L2 penalty in the gradient)
///   p = p * (1 - lr * weight_decay)               (adamw: decoupled decay, instead)
///   m = beta1 * m + (1 - beta1) * g
///   v = beta2 * v + (1 - beta2) * g^2
///   p = p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
class adam : public optimizer {
 public:
  /// Throws bad_argument for a negative lr/eps/weight_decay or betas outside [0, 1).
  adam(tensor_list params, adam_options opts = {});

 protected:
  /// Adam's update with `decoupled` choosing AdamW's decay.
  adam(tensor_list params, adam_options opts, bool decoupled);
  void update(tensor& param, const tensor& grad, param_state& st) override;
  std::vector<std::pair<std::string, double*>> hyperparameters() override;

 private:
  adam_options opts_;
  bool decoupled_;
};

/// AdamW: Adam with decoupled weight decay (Loshchilov & Hutter).
class adamw : public adam {
 public:
  adamw(tensor_list params, adam_options opts = adamw_options()) : adam(std::move(params), opts, true) {}
};

}  // namespace troupe::optim
