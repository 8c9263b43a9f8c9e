// Op layer: the tensor's in-place methods (zero_, fill_, add_/sub_/mul_/div_).
// In-place ops write through the tensor's own strides, bump the storage version counter and
// record with in_place = true (Note [Op recording]). The result dtype must be the tensor's:
// a floating result into an integer tensor is a dtype_mismatch, as in PyTorch.
#include <cmath>

#include "op_util.hpp"
#include "troupe/tensors/elementwise.hpp"

namespace troupe {

namespace {
using kernels::binary_op;

void check_result_fits(const char* op, const tensor& self, dtype result) {
  // PyTorch's canCast: floating results may not go into integer/bool tensors, nor integer
  // results into bool tensors; narrowing within a category (float64 into float32) is fine.
  const bool bad = (is_floating(result) && !is_floating(self.dtype())) ||
                   (result != dtype::boolean && self.dtype() == dtype::boolean);
  if (bad)
    throw error(errc::dtype_mismatch, std::string(op) + ": result type " + std::string(to_string(result)) +
                                          " cannot be written into " + ops::describe(self));
}

// other converted to self's dtype, broadcast to self's shape, and not overlapping self.
tensor prepare_other(const char* op, const tensor& self, const tensor& other, binary_op bop) {
  ops::check_same_device(op, self, other);
  dtype result = promote_types(self.dtype(), other.dtype());
  if (bop == binary_op::div && !is_floating(result)) result = dtype::float32;
  check_result_fits(op, self, result);
  if (broadcast_shapes(self.shape(), other.shape(), op) != self.shape())
    throw error(errc::shape_mismatch, std::string(op) + ": " + ops::describe(other) + " does not broadcast to " + ops::describe(self));
  no_grad_guard ng;
  tensor o = ops::cast(other, self.dtype());
  if (o.storage() == self.storage() && !(o.is_same(self) || (o.strides() == self.strides() && o.storage_offset() == self.storage_offset())))
    o = o.clone();  // partial overlap: read from a copy
  return ops::expand_to(o.detach(), self.shape());
}

void inplace_binary(const char* op, tensor& self, const tensor& other, binary_op bop, double alpha) {
  ops::check_defined(op, self);
  check_in_place(self, {&other}, op);  // before any write: a refused op leaves self untouched
  const tensor o = prepare_other(op, self, other, bop);
  // mul_/div_ backward needs self's value from before the write.
  const bool keep_old = (bop == binary_op::mul || bop == binary_op::div) && should_record({&other});
  const tensor old = keep_old ? self.detach().clone() : tensor();
  TROUPE_DISPATCH(self.device(), binary, bop, self, self, o, alpha);
  self.bump_version();
  ops::record(op, {self, other}, self, keep_old ? tensor_list{other, old} : tensor_list{other},
              [bop, alpha, so = other.shape(), to = other.dtype(), st = self.dtype()](const backward_ctx& c) {
                const tensor& g = c.grad_outputs[0];
                if (!g.defined()) return tensor_list(2);
                const tensor& y = c.saved[0];
                const tensor x_old = c.saved.size() > 1 ? c.saved[1] : tensor();
                tensor gs, go;
                switch (bop) {
                  case binary_op::add: gs = g; go = mul(g, alpha); break;
                  case binary_op::sub: gs = g; go = mul(g, -alpha); break;
                  case binary_op::mul: gs = mul(g, y); if (x_old.defined()) go = mul(g, x_old); break;
                  default: gs = div(g, y); if (x_old.defined()) go = neg(div(mul(g, x_old), mul(y, y))); break;
                }
                return tensor_list{c.needs_input_grad[0] ? ops::cast(gs, st) : tensor(),
                                   c.needs_input_grad[1] && go.defined() ? ops::reduce_grad(go, so, to) : tensor()};
              },
              true);
}

void inplace_scalar(const char* op, tensor& self, binary_op bop, double value) {
  ops::check_defined(op, self);
  check_in_place(self, {}, op);
  const bool integral = std::isfinite(value) && value == std::floor(value);
  if (!is_floating(self.dtype()) && (bop == binary_op::div || !integral))
    throw error(errc::dtype_mismatch, std::string(op) + ": a floating result cannot be written into " + ops::describe(self));
  TROUPE_DISPATCH(self.device(), binary_scalar, bop, self, self, value);
  self.bump_version();
  ops::record(op, {self}, self, {}, [bop, value, st = self.dtype()](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return tensor_list(1);
    if (bop == binary_op::mul) return tensor_list{ops::cast(mul(g, value), st)};
    if (bop == binary_op::div) return tensor_list{ops::cast(div(g, value), st)};
    return tensor_list{g};
  }, true);
}
}  // namespace

tensor& tensor::fill_(double value) {
  check_in_place(*this, {}, "fill_");
  TROUPE_DISPATCH(device(), fill, *this, value);
  bump_version();
  // The old value no longer matters: no gradient flows to it.
  ops::record("fill_", {*this}, *this, {}, [](const backward_ctx&) { return tensor_list(1); }, true);
  return *this;
}

tensor& tensor::zero_() { return fill_(0.0); }
tensor& tensor::add_(const tensor& other, double alpha) { inplace_binary("add_", *this, other, binary_op::add, alpha); return *this; }
tensor& tensor::sub_(const tensor& other) { inplace_binary("sub_", *this, other, binary_op::sub, 1.0); return *this; }
tensor& tensor::mul_(const tensor& other) { inplace_binary("mul_", *this, other, binary_op::mul, 1.0); return *this; }
tensor& tensor::div_(const tensor& other) { inplace_binary("div_", *this, other, binary_op::div, 1.0); return *this; }
tensor& tensor::add_(double value) { inplace_scalar("add_", *this, binary_op::add, value); return *this; }
tensor& tensor::mul_(double value) { inplace_scalar("mul_", *this, binary_op::mul, value); return *this; }
tensor& tensor::div_(double value) { inplace_scalar("div_", *this, binary_op::div, value); return *this; }

}  // namespace troupe
