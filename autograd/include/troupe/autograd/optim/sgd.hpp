#pragma once
/// \file sgd.hpp
/// Stochastic gradient descent with momentum, dampening, Nesterov and weight decay (torch.optim.SGD).

#include "troupe/autograd/optim/optimizer.hpp"

namespace troupe::optim {

/// SGD hyperparameters (PyTorch's defaults apart from lr, which PyTorch requires).
struct sgd_options {
  double lr = 1e-2;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

/// PyTorch's update, per parameter p with gradient g:
///   g = g + weight_decay * p
///   buf = g (first step) | momentum * buf + (1 - dampening) * g   (when momentum != 0)
///   g = g + momentum * buf (nesterov) | buf                        (when momentum != 0)
///   p = p - lr * g
class sgd : public optimizer {
 public:
  /// Throws bad_argument for negative values, or nesterov without momentum / with dampening.
  sgd(tensor_list params, sgd_options opts);

 protected:
  void update(tensor& param, const tensor& grad, param_state& st) override;
  std::vector<std::pair<std::string, double*>> hyperparameters() override;

 private:
  sgd_options opts_;
  double nesterov_ = 0;  // mirrored as a number for state_dict
};

}  // namespace troupe::optim
