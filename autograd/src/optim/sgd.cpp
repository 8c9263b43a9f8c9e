// SGD updates (PyTorch's rule; see the formula in sgd.hpp).
#include "troupe/autograd/optim/sgd.hpp"

#include <cmath>

#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::optim {

sgd::sgd(tensor_list params, sgd_options opts) : optimizer(std::move(params)), opts_(opts) {
  check_non_negative("sgd", "lr", opts.lr);
  check_non_negative("sgd", "momentum", opts.momentum);
  check_non_negative("sgd", "dampening", opts.dampening);
  check_non_negative("sgd", "weight_decay", opts.weight_decay);
  if (opts.nesterov && (opts.momentum <= 0 || opts.dampening != 0))
    throw error(errc::bad_argument, "sgd: nesterov momentum requires momentum > 0 and dampening = 0");
  lr_ = opts.lr;
  nesterov_ = opts.nesterov ? 1.0 : 0.0;
}

std::vector<std::pair<std::string, double*>> sgd::hyperparameters() {
  return {{"momentum", &opts_.momentum},
          {"dampening", &opts_.dampening},
          {"weight_decay", &opts_.weight_decay},
          {"nesterov", &nesterov_}};
}

void sgd::update(tensor& param, const tensor& grad, param_state& st) {
  tensor g = grad;
  if (opts_.weight_decay != 0) g = add(g, param, opts_.weight_decay);
  if (opts_.momentum != 0) {
    auto it = st.buffers.find("momentum_buffer");
    if (it == st.buffers.end()) {
      it = st.buffers.emplace("momentum_buffer", g.clone()).first;
    } else {
      it->second.mul_(opts_.momentum).add_(g, 1.0 - opts_.dampening);
    }
    g = nesterov_ != 0 ? add(g, it->second, opts_.momentum) : it->second;
  }
  st.step += 1;
  param.add_(g, -lr_);
}

}  // namespace troupe::optim
