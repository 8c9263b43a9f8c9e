// Adam and AdamW updates (PyTorch's rules; see the formulas in adam.hpp).
#include "troupe/autograd/optim/adam.hpp"

#include <cmath>

#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::optim {

adam::adam(tensor_list params, adam_options opts) : adam(std::move(params), opts, false) {}

adam::adam(tensor_list params, adam_options opts, bool decoupled)
    : optimizer(std::move(params)), opts_(opts), decoupled_(decoupled) {
  const char* name = decoupled ? "adamw" : "adam";
  check_non_negative(name, "lr", opts.lr);
  check_non_negative(name, "eps", opts.eps);
  check_non_negative(name, "weight_decay", opts.weight_decay);
  if (!(opts.beta1 >= 0 && opts.beta1 < 1) || !(opts.beta2 >= 0 && opts.beta2 < 1))
    throw error(errc::bad_argument, std::string(name) + ": betas must be in [0, 1), got (" +
                                        std::to_string(opts.beta1) + ", " + std::to_string(opts.beta2) + ")");
  lr_ = opts.lr;
}

std::vector<std::pair<std::string, double*>> adam::hyperparameters() {
  return {{"beta1", &opts_.beta1}, {"beta2", &opts_.beta2}, {"eps", &opts_.eps},
          {"weight_decay", &opts_.weight_decay}};
}

void adam::update(tensor& param, const tensor& grad, param_state& st) {
  tensor g = grad;
  if (opts_.weight_decay != 0) {
    if (decoupled_) param.mul_(1.0 - lr_ * opts_.weight_decay);
    else g = add(g, param, opts_.weight_decay);
  }
  auto& m = st.buffers["exp_avg"];
  auto& v = st.buffers["exp_avg_sq"];
  if (!m.defined()) m = zeros_like(param);
  if (!v.defined()) v = zeros_like(param);
  st.step += 1;
  m.mul_(opts_.beta1).add_(g, 1.0 - opts_.beta1);
  v.mul_(opts_.beta2).add_(mul(g, g), 1.0 - opts_.beta2);
  const double bias1 = 1.0 - std::pow(opts_.beta1, st.step);
  const double bias2 = 1.0 - std::pow(opts_.beta2, st.step);
  tensor denom = sqrt(v);
  denom.div_(std::sqrt(bias2)).add_(opts_.eps);
  param.add_(div(m, denom), -lr_ / bias1);
}

}  // namespace troupe::optim
