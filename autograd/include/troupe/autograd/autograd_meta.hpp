#pragma once
/// \file autograd_meta.hpp
/// The autograd metadata of a tensor (PyTorch's AutogradMeta) and the recording of ops into
/// graph nodes (Note [Op recording] in troupe/tensors/autograd_hook.hpp).

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "troupe/autograd/grad_node.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe {

/// Autograd metadata attached to a tensor's impl. A leaf has no grad_fn; it requires grad when
/// its flag is set. A non-leaf (an op's output) has grad_fn + output_nr and always requires grad.
/// Fields are public (a record, like PyTorch's AutogradMeta); `mutex` guards the lazily created
/// grad accumulator and the hook lists, the node's run mutex guards `grad` during backward.
class autograd_meta final : public autograd_meta_interface {
 public:
  using post_accumulate_hook = std::function<void(const tensor&)>;

  /// True for a leaf with the flag set and for every non-leaf.
  bool requires_grad() const override { return requires_grad_flag || grad_fn != nullptr; }

  /// Turns `rec` into an op_node. Next edges: each input's (grad_fn, output_nr), or its leaf's
  /// accumulate_grad, or none. Outputs (floating point only) get grad_fn = node, output_nr = i.
  /// In-place records rebase the modified tensor's history onto the node.
  /// Throws autograd_error for an in-place op on a leaf that requires grad, not_supported for an
  /// in-place op on a view whose base requires grad.
  void record(op_record&& rec) const override;
  void check_in_place(const tensor& self, const std::string& op) const override;

  bool requires_grad_flag = false;  ///< set by set_requires_grad (leaves only)
  tensor grad;                      ///< the accumulated gradient (.grad)
  std::shared_ptr<grad_node> grad_fn;    ///< the node that produced this tensor (null for a leaf)
  std::uint32_t output_nr = 0;      ///< which output of grad_fn this tensor is
  bool retains_grad = false;        ///< retain_grad() was called on this non-leaf
  /// Tensor hooks of a leaf (a non-leaf's hooks live on its grad_fn), by id.
  std::vector<std::pair<std::uint64_t, tensor_hook>> hooks;
  /// Hooks run after the leaf's .grad was updated, by id.
  std::vector<std::pair<std::uint64_t, post_accumulate_hook>> post_accumulate_hooks;
  /// The leaf's accumulate_grad, cached weakly: shared by all live graphs using the leaf.
  std::weak_ptr<grad_node> grad_accumulator;
  std::uint64_t next_hook_id = 0;
  mutable std::mutex mutex;
};

/// The tensor's autograd_meta, or null if it has none (throws invalid_state if undefined).
autograd_meta* meta_of(const tensor& t);
/// The tensor's autograd_meta, created (not requiring grad) if missing.
autograd_meta& materialize_meta(const tensor& t);
/// The edge a gradient for `t` flows into: (grad_fn, output_nr), the leaf's accumulate_grad, or
/// an invalid edge if `t` does not require grad.
edge gradient_edge(const tensor& t);
/// The leaf's accumulate_grad, created on first use (null if `t` is not a leaf requiring grad).
std::shared_ptr<grad_node> grad_accumulator(const tensor& t);
/// Makes grad_fn(t) store the gradient of `t` into its .grad during backward (retain_grad);
/// does nothing for a leaf.
void install_retains_grad_hook(const tensor& t);

}  // namespace troupe
