// The user API of local autograd on tensors.
#include "troupe/autograd/variable.hpp"

#include <algorithm>

#include "troupe/autograd/autograd_meta.hpp"
#include "troupe/autograd/engine.hpp"

namespace troupe {

namespace {
void require_grad(const tensor& t, const char* fn) {
  if (!t.requires_grad())
    throw error(errc::autograd_error, std::string(fn) + ": tensor of shape " + shape_to_string(t.shape()) +
                                          " does not require grad; call set_requires_grad first");
}

template <class Hook>
hook_handle add_meta_hook(const tensor& t, std::vector<std::pair<std::uint64_t, Hook>> autograd_meta::*list,
                          Hook fn) {
  auto& m = *meta_of(t);
  std::lock_guard<std::mutex> lk(m.mutex);
  const auto id = m.next_hook_id++;
  (m.*list).emplace_back(id, std::move(fn));
  std::weak_ptr<autograd_meta_interface> w = t.impl()->autograd_meta;
  return hook_handle([w, list, id] {
    if (auto p = w.lock()) {
      auto& am = *static_cast<autograd_meta*>(p.get());
      std::lock_guard<std::mutex> l(am.mutex);
      auto& v = am.*list;
      v.erase(std::remove_if(v.begin(), v.end(), [id](const auto& h) { return h.first == id; }), v.end());
    }
  });
}
}  // namespace

tensor& set_requires_grad(tensor& t, bool on) {
  auto* m = meta_of(t);
  if (m && m->grad_fn)
    throw error(errc::autograd_error, "set_requires_grad: only leaf tensors can change requires_grad, but this tensor "
                                      "(shape " + shape_to_string(t.shape()) + ") was produced by " +
                                          m->grad_fn->name() + "; use detach() to get a leaf");
  if (on && !is_floating(t.dtype()))
    throw error(errc::dtype_mismatch, "set_requires_grad: only floating point tensors can require gradients, got " +
                                          std::string(to_string(t.dtype())));
  if (!m && !on) return t;
  materialize_meta(t).requires_grad_flag = on;
  return t;
}

tensor grad(const tensor& t) {
  auto* m = meta_of(t);
  return m ? m->grad : tensor();
}

void set_grad(const tensor& t, tensor g) {
  if (g.defined()) {
    if (g.shape() != t.shape())
      throw error(errc::shape_mismatch, "set_grad: gradient of shape " + shape_to_string(g.shape()) +
                                            " for a tensor of shape " + shape_to_string(t.shape()));
    if (g.dtype() != t.dtype())
      throw error(errc::dtype_mismatch, "set_grad: gradient of dtype " + std::string(to_string(g.dtype())) +
                                            " for a tensor of dtype " + std::string(to_string(t.dtype())));
    if (g.device() != t.device())
      throw error(errc::device_mismatch, "set_grad: gradient on " + to_string(g.device()) + " for a tensor on " +
                                             to_string(t.device()));
  }
  if (!g.defined() && !meta_of(t)) return;
  materialize_meta(t).grad = std::move(g);
}

bool is_leaf(const tensor& t) {
  auto* m = meta_of(t);
  return !m || !m->grad_fn;
}

std::shared_ptr<grad_node> grad_fn(const tensor& t) {
  auto* m = meta_of(t);
  return m ? m->grad_fn : nullptr;
}

std::uint32_t output_nr(const tensor& t) {
  auto* m = meta_of(t);
  return m ? m->output_nr : 0;
}

void retain_grad(const tensor& t) {
  require_grad(t, "retain_grad");
  auto& m = *meta_of(t);
  if (!m.grad_fn || m.retains_grad) return;
  m.retains_grad = true;
  install_retains_grad_hook(t);
}

hook_handle register_hook(const tensor& t, std::function<tensor(const tensor&)> hook) {
  require_grad(t, "register_hook");
  auto& m = *meta_of(t);
  if (m.grad_fn) return m.grad_fn->register_tensor_pre_hook(m.output_nr, std::move(hook));
  return add_meta_hook<tensor_hook>(t, &autograd_meta::hooks, std::move(hook));
}

hook_handle register_post_accumulate_grad_hook(const tensor& leaf, std::function<void(const tensor&)> hook) {
  require_grad(leaf, "register_post_accumulate_grad_hook");
  if (!is_leaf(leaf))
    throw error(errc::autograd_error, "register_post_accumulate_grad_hook: tensor of shape " +
                                          shape_to_string(leaf.shape()) + " is not a leaf (produced by " +
                                          grad_fn(leaf)->name() + ")");
  return add_meta_hook<autograd_meta::post_accumulate_hook>(leaf, &autograd_meta::post_accumulate_hooks,
                                                            std::move(hook));
}

void backward(const tensor& root, const tensor& grad_root, bool retain_graph) {
  engine().backward({root}, {grad_root}, retain_graph);
}

void zero_grad(tensor& t) {
  auto* m = meta_of(t);
  if (!m || !m->grad.defined()) return;
  no_grad_guard ng;
  m->grad.zero_();
}

}  // namespace troupe
