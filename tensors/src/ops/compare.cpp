// Op layer: comparisons (bool results, not differentiable), where (differentiable in a and b),
// equal and allclose.
#include <cmath>

#include "op_util.hpp"
#include "troupe/tensors/elementwise.hpp"

namespace troupe {

namespace {
using kernels::compare_op;

tensor compare_forward(const char* name, compare_op op, const tensor& a, const tensor& b) {
  ops::check_same_device(name, a, b);
  const dtype t = promote_types(a.dtype(), b.dtype());
  const shape_t shape = broadcast_shapes(a.shape(), b.shape(), name);
  tensor out = empty(shape, tensor_options(dtype::boolean, a.device()));
  TROUPE_DISPATCH(a.device(), compare, op, out, ops::expand_to(ops::cast(a, t), shape), ops::expand_to(ops::cast(b, t), shape));
  return out;
}

tensor compare_scalar(const char* name, compare_op op, const tensor& a, double b) {
  ops::check_defined(name, a);
  // An integer tensor against a non-integral scalar compares in float64 (exact for both).
  const bool integral_scalar = std::isfinite(b) && b == std::floor(b);
  const dtype t = is_floating(a.dtype()) || integral_scalar ? a.dtype() : dtype::float64;
  const tensor s = scalar_tensor(b, tensor_options(t, a.device()));
  return compare_forward(name, op, ops::cast(a, t), s);
}
}  // namespace

tensor eq(const tensor& a, const tensor& b) { return compare_forward("eq", compare_op::eq, a, b); }
tensor ne(const tensor& a, const tensor& b) { return compare_forward("ne", compare_op::ne, a, b); }
tensor lt(const tensor& a, const tensor& b) { return compare_forward("lt", compare_op::lt, a, b); }
tensor le(const tensor& a, const tensor& b) { return compare_forward("le", compare_op::le, a, b); }
tensor gt(const tensor& a, const tensor& b) { return compare_forward("gt", compare_op::gt, a, b); }
tensor ge(const tensor& a, const tensor& b) { return compare_forward("ge", compare_op::ge, a, b); }
tensor eq(const tensor& a, double b) { return compare_scalar("eq", compare_op::eq, a, b); }
tensor ne(const tensor& a, double b) { return compare_scalar("ne", compare_op::ne, a, b); }
tensor lt(const tensor& a, double b) { return compare_scalar("lt", compare_op::lt, a, b); }
tensor le(const tensor& a, double b) { return compare_scalar("le", compare_op::le, a, b); }
tensor gt(const tensor& a, double b) { return compare_scalar("gt", compare_op::gt, a, b); }
tensor ge(const tensor& a, double b) { return compare_scalar("ge", compare_op::ge, a, b); }

tensor where(const tensor& cond, const tensor& a, const tensor& b) {
  ops::check_same_device("where", cond, a);
  ops::check_same_device("where", a, b);
  if (cond.dtype() != dtype::boolean)
    throw error(errc::dtype_mismatch, "where: condition must be bool, got " + ops::describe(cond));
  const dtype t = promote_types(a.dtype(), b.dtype());
  const shape_t shape = broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape(), "where"), "where");
  tensor out = empty(shape, tensor_options(t, a.device()));
  TROUPE_DISPATCH(a.device(), where, out, ops::expand_to(cond, shape), ops::expand_to(ops::cast(a, t), shape),
                  ops::expand_to(ops::cast(b, t), shape));
  ops::record("where", {a, b}, out, {cond},
              [sa = a.shape(), sb = b.shape(), ta = a.dtype(), tb = b.dtype()](const backward_ctx& c) {
                const tensor& g = c.grad_outputs[0];
                if (!g.defined()) return tensor_list(2);
                const tensor zero = scalar_tensor(0.0, tensor_options(g.dtype(), g.device()));
                const tensor& m = c.saved[0];
                return tensor_list{c.needs_input_grad[0] ? ops::reduce_grad(where(m, g, zero), sa, ta) : tensor(),
                                   c.needs_input_grad[1] ? ops::reduce_grad(where(m, zero, g), sb, tb) : tensor()};
              });
  return out;
}

namespace {
// Number of true elements of a bool tensor.
std::int64_t count_true(const tensor& m) { return static_cast<std::int64_t>(sum(m).item()); }
}  // namespace

bool equal(const tensor& a, const tensor& b) {
  ops::check_same_device("equal", a, b);
  if (a.shape() != b.shape()) return false;
  no_grad_guard ng;
  return count_true(eq(a, b)) == a.numel();
}

bool allclose(const tensor& a, const tensor& b, double rtol, double atol, bool equal_nan) {
  ops::check_same_device("allclose", a, b);
  no_grad_guard ng;
  const tensor x = ops::cast(a, dtype::float64), y = ops::cast(b, dtype::float64);
  const shape_t shape = broadcast_shapes(a.shape(), b.shape(), "allclose");
  tensor close = le(abs(sub(x, y)), add(mul(abs(y), rtol), atol));
  const tensor yes = scalar_tensor(1.0, tensor_options(dtype::boolean, a.device()));
  close = where(eq(x, y), yes, close);  // equal infinities are close
  if (equal_nan) close = where(mul(ne(x, x), ne(y, y)), yes, close);
  return count_true(close) == numel_of(shape);
}

}  // namespace troupe
