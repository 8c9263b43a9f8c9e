// The node of a recorded op: saved-tensor version checks, the backward formula, and the
// validation of the gradients it returns.
#include <algorithm>

#include "troupe/autograd/grad_node.hpp"
#include "troupe/autograd/saved_variable.hpp"

namespace troupe {

saved_variable::saved_variable(const tensor& t) {
  if (!t.defined()) return;
  data_ = t.detach();
  version_ = t.version();
}

tensor saved_variable::unpack(const std::string& op) const {
  if (!data_.defined()) return data_;
  const auto now = data_.version();
  if (now != version_)
    throw error(errc::autograd_error, "saved tensor of " + op + " was modified in place (version " +
                                          std::to_string(now) + ", expected " + std::to_string(version_) +
                                          "); shape " + shape_to_string(data_.shape()) +
                                          "; clone() it before modifying it, or modify it out of place");
  return data_;
}

namespace {
edge_list checked_edges(edge_list e, std::size_t n_inputs, const std::string& name) {
  if (e.size() != n_inputs)
    throw error(errc::autograd_error, "op_node " + name + ": " + std::to_string(e.size()) + " edges for " +
                                          std::to_string(n_inputs) + " inputs");
  return e;
}
}  // namespace

op_node::op_node(op_record&& rec, edge_list edges, std::vector<input_info> inputs)
    : grad_node(rec.name, checked_edges(std::move(edges), inputs.size(), rec.name),
           static_cast<std::uint32_t>(rec.outputs.size())),
      backward_(std::move(rec.backward)),
      inputs_(std::move(inputs)) {
  saved_.reserve(rec.saved.size());
  for (const auto& t : rec.saved) saved_.emplace_back(t);
  needs_input_grad_.reserve(this->next_edges().size());
  for (const auto& e : this->next_edges()) needs_input_grad_.push_back(e.valid());
}

void op_node::release_variables() {
  // Like PyTorch, only a node that saved tensors refuses a second backward.
  if (saved_.empty()) return;
  for (auto& s : saved_) s.reset();
  released_ = true;
}

tensor_list op_node::apply(tensor_list&& grads) {
  if (released_)
    throw error(errc::autograd_error, "trying to backward through the graph a second time (" + name() +
                                          "); pass retain_graph=true to the first backward (its saved tensors "
                                          "were freed after it)");
  const bool any = std::any_of(grads.begin(), grads.end(), [](const tensor& g) { return g.defined(); });
  if (!any) return tensor_list(inputs_.size());
  tensor_list saved;
  saved.reserve(saved_.size());
  for (const auto& s : saved_) saved.push_back(s.unpack(name()));
  const backward_ctx ctx{saved, grads, needs_input_grad_};
  return validate(backward_(ctx));
}

tensor_list op_node::validate(tensor_list&& grads) const {
  if (grads.size() != inputs_.size())
    throw error(errc::autograd_error, "backward of " + name() + " returned " + std::to_string(grads.size()) +
                                          " gradients for " + std::to_string(inputs_.size()) + " inputs");
  for (std::size_t i = 0; i < grads.size(); ++i) {
    tensor& g = grads[i];
    if (!g.defined()) continue;
    if (!needs_input_grad_[i]) {
      g = tensor();  // the formula computed a gradient nobody needs
      continue;
    }
    const auto& in = inputs_[i];
    if (g.shape() != in.shape)
      throw error(errc::autograd_error, "backward of " + name() + " returned a gradient of shape " +
                                            shape_to_string(g.shape()) + " for input " + std::to_string(i) +
                                            " of shape " + shape_to_string(in.shape));
    if (g.device() != in.device)
      throw error(errc::autograd_error, "backward of " + name() + " returned a gradient on " + to_string(g.device()) +
                                            " for input " + std::to_string(i) + " on " + to_string(in.device));
    if (g.dtype() != in.dtype) g = g.to(in.dtype);
  }
  return std::move(grads);
}

}  // namespace troupe
