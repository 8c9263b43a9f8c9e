// The sink of a leaf: tensor hooks, accumulation into .grad, post-accumulate-grad hooks.
#include <limits>

#include "troupe/autograd/autograd_meta.hpp"
#include "troupe/autograd/grad_node.hpp"
#include "troupe/tensors/elementwise.hpp"

namespace troupe {

// The maximal sequence number makes a ready accumulate_grad run before other ready nodes, so
// a leaf's .grad (and DDP's hooks) are updated as early as possible, as PyTorch does.
accumulate_grad::accumulate_grad(tensor leaf)
    : grad_node("accumulate_grad", {}, 1, std::numeric_limits<std::uint64_t>::max()), variable_(std::move(leaf)) {}

namespace {
template <class Hook>
std::vector<Hook> copy_hooks(const autograd_meta& m, const std::vector<std::pair<std::uint64_t, Hook>>& v) {
  std::lock_guard<std::mutex> lk(m.mutex);
  std::vector<Hook> out;
  out.reserve(v.size());
  for (const auto& [id, fn] : v) out.push_back(fn);
  return out;
}
}  // namespace

tensor_list accumulate_grad::apply(tensor_list&& grads) {
  auto* meta = meta_of(variable_);
  if (grads.empty() || !grads[0].defined() || !meta) return {};
  tensor g = std::move(grads[0]);
  for (const auto& hook : copy_hooks(*meta, meta->hooks)) {
    tensor r = hook(g);
    if (r.defined()) g = std::move(r);
  }
  if (g.shape() != variable_.shape())
    throw error(errc::autograd_error, "accumulate_grad: gradient of shape " + shape_to_string(g.shape()) +
                                          " for a leaf of shape " + shape_to_string(variable_.shape()));
  {
    no_grad_guard ng;
    if (!meta->grad.defined()) {
      // A fresh, contiguous copy: the incoming gradient may be a view or shared with others.
      meta->grad = g.dtype() == variable_.dtype() ? g.clone() : g.to(variable_.dtype());
    } else {
      meta->grad.add_(g.dtype() == meta->grad.dtype() ? g : g.to(meta->grad.dtype()));
    }
  }
  for (const auto& hook : copy_hooks(*meta, meta->post_accumulate_hooks)) hook(variable_);
  return {};
}

}  // namespace troupe
