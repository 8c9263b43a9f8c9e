// Recording ops into graph nodes (Note [Op recording] in troupe/tensors/autograd_hook.hpp).
#include "troupe/autograd/autograd_meta.hpp"

#if defined(TROUPE_WITH_CUDA)
#include "troupe/tensors/cuda.hpp"
#endif

namespace troupe {

autograd_meta* meta_of(const tensor& t) {
  // Only the autograd layer creates metadata, and it only creates autograd_meta.
  return static_cast<autograd_meta*>(t.autograd_meta());
}

autograd_meta& materialize_meta(const tensor& t) {
  if (auto* m = meta_of(t)) return *m;
  auto m = std::make_shared<autograd_meta>();
  auto* raw = m.get();
  t.set_autograd_meta(std::move(m));
  return *raw;
}

std::shared_ptr<grad_node> grad_accumulator(const tensor& t) {
  auto* m = meta_of(t);
  if (!m || m->grad_fn || !m->requires_grad_flag) return nullptr;
  std::lock_guard<std::mutex> lk(m->mutex);
  if (auto acc = m->grad_accumulator.lock()) return acc;
  auto acc = std::make_shared<accumulate_grad>(t);
  m->grad_accumulator = acc;
  return acc;
}

edge gradient_edge(const tensor& t) {
  if (!t.defined()) return {};
  auto* m = meta_of(t);
  if (!m) return {};
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  return {grad_accumulator(t), 0};
}

void install_retains_grad_hook(const tensor& t) {
  auto* m = meta_of(t);
  if (!m || !m->grad_fn) return;
  std::weak_ptr<autograd_meta_interface> w = t.impl()->autograd_meta;
  m->grad_fn->set_retains_grad_hook(m->output_nr, [w](const tensor& g) {
    if (auto p = w.lock()) {
      // Runs inside the engine (grad mode off), under the node's run mutex.
      auto* am = static_cast<autograd_meta*>(p.get());
      am->grad = am->grad.defined() ? am->grad + g : g.clone();
    }
  });
}

namespace {

void check_in_place_allowed(const tensor& self, const std::string& op) {
  if (const auto* m = meta_of(self); m && !m->grad_fn && m->requires_grad_flag)
    throw error(errc::autograd_error, "a leaf tensor that requires grad is used in an in-place operation " + op +
                                          " (shape " + shape_to_string(self.shape()) +
                                          "); do it under no_grad_guard, or on a clone()");
  if (self.is_view() && self.base().requires_grad())
    throw error(errc::not_supported, "in-place operation " + op + " on a view (shape " +
                                         shape_to_string(self.shape()) + ") of a tensor that requires grad (shape " +
                                         shape_to_string(self.base().shape()) +
                                         ") is not supported; apply the op out of place, or clone() the view first");
}

void check_in_place_record(const op_record& rec) {
  if (rec.outputs.size() != 1 || rec.inputs.empty() || !rec.outputs[0].is_same(rec.inputs[0]))
    throw error(errc::autograd_error, "in-place op " + rec.name + " must record outputs == {inputs[0]}");
  check_in_place_allowed(rec.outputs[0], rec.name);
}

// Gives `out` the history (fn, nr). An in-place op rebases an existing tensor: its metadata is
// kept (hooks already registered stay on the old node, as in PyTorch) and retain_grad moves on.
void set_history(const tensor& out, const std::shared_ptr<grad_node>& fn, std::uint32_t nr) {
  auto& m = materialize_meta(out);
  m.grad_fn = fn;
  m.output_nr = nr;
  if (m.retains_grad) {
    install_retains_grad_hook(out);
  }
}

}  // namespace

void autograd_meta::check_in_place(const tensor& self, const std::string& op) const {
  check_in_place_allowed(self, op);
}

void autograd_meta::record(op_record&& rec) const {
  if (rec.in_place) check_in_place_record(rec);
  edge_list next;
  std::vector<input_info> infos;
  next.reserve(rec.inputs.size());
  infos.reserve(rec.inputs.size());
  bool any = false;
  for (const auto& in : rec.inputs) {
    next.push_back(gradient_edge(in));
    any = any || next.back().valid();
    if (in.defined()) infos.push_back({true, in.shape(), in.dtype(), in.device()});
    else infos.emplace_back();
  }
  if (!any) return;
  tensor_list outputs = rec.outputs;
  auto fn = std::make_shared<op_node>(std::move(rec), std::move(next), std::move(infos));
#if defined(TROUPE_WITH_CUDA)
  // Note [Backward streams]: remember the forward stream of the outputs' device.
  for (const auto& o : outputs)
    if (o.defined() && o.is_cuda()) {
      fn->set_forward_stream(o.device().index, cuda::current_stream(o.device().index));
      break;
    }
#endif
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const tensor& out = outputs[i];
    if (!out.defined() || !is_floating(out.dtype())) continue;
    set_history(out, fn, static_cast<std::uint32_t>(i));
  }
}

}  // namespace troupe
