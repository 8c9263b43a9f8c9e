#include "troupe/dist_autograd/functions.hpp"

#include <utility>

namespace troupe::dist_autograd {

send_function::send_function(edge_list edges, std::vector<troupe::device> devices)
    : grad_node("dist_autograd::send", edges, static_cast<std::uint32_t>(edges.size())), devices_(std::move(devices)) {}

tensor_list send_function::apply(tensor_list&& grads) {
  // Note [Gradients keep their device]
  for (std::size_t i = 0; i < grads.size() && i < devices_.size(); ++i)
    if (grads[i].defined() && grads[i].device() != devices_[i]) grads[i] = grads[i].to(devices_[i]);
  return std::move(grads);
}

recv_function::recv_function(std::uint32_t num_tensors, std::string from, propagate_fn propagate)
    : grad_node("dist_autograd::recv", {}, num_tensors), from_(std::move(from)), propagate_(std::move(propagate)) {}

tensor_list recv_function::apply(tensor_list&& grads) {
  if (propagate_) propagate_(grads, run_);
  return {};
}

}  // namespace troupe::dist_autograd
