// The optimizer base: parameter bookkeeping, the two step forms and state dicts.
#include "troupe/autograd/optim/optimizer.hpp"

#include <cmath>
#include <set>

#include "troupe/autograd/variable.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::optim {

namespace {

constexpr const char* group_prefix = "param_groups.0.";

tensor scalar(double v) { return scalar_tensor(v, dtype::float64); }

// Splits "state.<i>.<name>" into (i, name); false for any other key.
bool parse_state_key(const std::string& key, std::size_t& index, std::string& name) {
  if (key.rfind("state.", 0) != 0) return false;
  const auto dot = key.find('.', 6);
  if (dot == std::string::npos || dot == 6) return false;
  const std::string num = key.substr(6, dot - 6);
  if (num.find_first_not_of("0123456789") != std::string::npos) return false;
  index = std::stoul(num);
  name = key.substr(dot + 1);
  return !name.empty();
}

}  // namespace

optimizer::optimizer(tensor_list params) : params_(std::move(params)), state_(params_.size()) {
  if (params_.empty()) throw error(errc::bad_argument, "optimizer: got an empty parameter list");
  std::set<const tensor_impl*> seen;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    if (!p.defined()) throw error(errc::bad_argument, "optimizer: parameter " + std::to_string(i) + " is undefined");
    if (!p.requires_grad())
      throw error(errc::bad_argument, "optimizer: parameter " + std::to_string(i) + " of shape " +
                                          shape_to_string(p.shape()) + " does not require grad");
    if (!seen.insert(p.impl().get()).second)
      throw error(errc::bad_argument, "optimizer: parameter " + std::to_string(i) + " appears twice");
  }
}

void optimizer::check_non_negative(const char* opt, const char* name, double value) {
  if (!(value >= 0.0) || !std::isfinite(value))
    throw error(errc::bad_argument, std::string(opt) + ": invalid " + name + " " + std::to_string(value));
}

std::size_t optimizer::index_of(const tensor& p) const {
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (params_[i].is_same(p)) return i;
  throw error(errc::bad_argument, "optimizer::step: a tensor of shape " +
                                      (p.defined() ? shape_to_string(p.shape()) : std::string("<undefined>")) +
                                      " is not a parameter of this optimizer");
}

void optimizer::apply(std::size_t i, const tensor& grad) {
  tensor& p = params_[i];
  const auto where = "optimizer::step: parameter " + std::to_string(i);
  if (grad.shape() != p.shape())
    throw error(errc::shape_mismatch, where + " has shape " + shape_to_string(p.shape()) + " but its gradient " +
                                          shape_to_string(grad.shape()));
  if (grad.dtype() != p.dtype())
    throw error(errc::dtype_mismatch, where + " has dtype " + std::string(to_string(p.dtype())) +
                                          " but its gradient " + std::string(to_string(grad.dtype())));
  if (grad.device() != p.device())
    throw error(errc::device_mismatch, where + " is on " + to_string(p.device()) + " but its gradient on " +
                                           to_string(grad.device()));
  update(p, grad, state_[i]);
}

void optimizer::step() {
  no_grad_guard guard;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const tensor g = grad(params_[i]);
    if (g.defined()) apply(i, g);
  }
}

void optimizer::step(const tensor_list& params, const tensor_list& grads) {
  if (params.size() != grads.size())
    throw error(errc::bad_argument, "optimizer::step: " + std::to_string(params.size()) + " parameters but " +
                                        std::to_string(grads.size()) + " gradients");
  std::vector<std::size_t> idx;
  for (const auto& p : params) idx.push_back(index_of(p));  // validate all before updating any
  no_grad_guard guard;
  for (std::size_t k = 0; k < params.size(); ++k)
    if (grads[k].defined()) apply(idx[k], grads[k]);
}

void optimizer::zero_grad() {
  for (auto& p : params_) troupe::zero_grad(p);
}

troupe::state_dict optimizer::state_dict() const {
  troupe::state_dict sd;
  sd.emplace(std::string(group_prefix) + "lr", scalar(lr_));
  for (auto& [name, ptr] : const_cast<optimizer*>(this)->hyperparameters())
    sd.emplace(group_prefix + name, scalar(*ptr));
  for (std::size_t i = 0; i < state_.size(); ++i) {
    if (state_[i].step == 0 && state_[i].buffers.empty()) continue;
    const std::string pre = "state." + std::to_string(i) + ".";
    sd.emplace(pre + "step", scalar(state_[i].step));
    for (const auto& [name, buf] : state_[i].buffers) sd.emplace(pre + name, buf.detach());
  }
  return sd;
}

void optimizer::load_state_dict(const troupe::state_dict& sd) {
  auto hyper = hyperparameters();
  std::map<std::string, double*> hyper_by_key{{std::string(group_prefix) + "lr", &lr_}};
  for (auto& [name, ptr] : hyper) hyper_by_key[group_prefix + name] = ptr;
  std::vector<param_state> next(params_.size());
  std::map<double*, double> next_hyper;
  for (const auto& [key, t] : sd) {
    if (!t.defined()) throw error(errc::bad_argument, "optimizer::load_state_dict: key '" + key + "' is undefined");
    if (auto it = hyper_by_key.find(key); it != hyper_by_key.end()) {
      next_hyper[it->second] = t.item();
      continue;
    }
    std::size_t i = 0;
    std::string name;
    if (!parse_state_key(key, i, name) || i >= params_.size())
      throw error(errc::bad_argument, "optimizer::load_state_dict: unexpected key '" + key + "' (optimizer has " +
                                          std::to_string(params_.size()) + " parameters)");
    if (name == "step") { next[i].step = t.item(); continue; }
    const tensor& p = params_[i];
    if (t.shape() != p.shape())
      throw error(errc::shape_mismatch, "optimizer::load_state_dict: key '" + key + "' has shape " +
                                            shape_to_string(t.shape()) + ", parameter " + std::to_string(i) +
                                            " has shape " + shape_to_string(p.shape()));
    if (t.dtype() != p.dtype())
      throw error(errc::dtype_mismatch, "optimizer::load_state_dict: key '" + key + "' has dtype " +
                                            std::string(to_string(t.dtype())) + ", parameter " +
                                            std::to_string(i) + " has dtype " + std::string(to_string(p.dtype())));
    next[i].buffers[name] = t.detach().to(p.device()).clone();
  }
  for (auto& [ptr, v] : next_hyper) *ptr = v;
  state_ = std::move(next);
}

}  // namespace troupe::optim
