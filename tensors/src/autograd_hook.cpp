#include "troupe/tensors/autograd_hook.hpp"

namespace troupe {

namespace {
// Grad mode is per thread, like PyTorch's; a thread starts with recording enabled.
thread_local bool grad_enabled = true;

bool any_requires_grad(const tensor* const* first, const tensor* const* last) {
  for (; first != last; ++first)
    if (*first && (*first)->defined() && (*first)->requires_grad()) return true;
  return false;
}
}  // namespace

bool grad_mode::is_enabled() noexcept { return grad_enabled; }
void grad_mode::set_enabled(bool on) noexcept { grad_enabled = on; }

bool should_record(std::initializer_list<const tensor*> inputs) {
  return grad_enabled && any_requires_grad(inputs.begin(), inputs.end());
}

bool should_record(const tensor_list& inputs) {
  if (!grad_enabled) return false;
  for (const auto& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void record_op(op_record&& rec) {
  for (const auto& t : rec.inputs) {
    if (t.defined() && t.requires_grad()) {
      const auto* meta = t.autograd_meta();
      meta->record(std::move(rec));
      return;
    }
  }
}

void check_in_place(const tensor& self, std::initializer_list<const tensor*> others, const char* op) {
  if (!grad_enabled) return;
  // Any metadata will do: the check reads only `self` (its own history and its base's).
  const autograd_meta_interface* meta = self.autograd_meta();
  if (!meta && self.is_view()) meta = self.base().autograd_meta();
  for (const tensor* o : others) {
    if (meta) break;
    if (o && o->defined() && o->requires_grad()) meta = o->autograd_meta();
  }
  if (meta) meta->check_in_place(self, op);
}

}  // namespace troupe
