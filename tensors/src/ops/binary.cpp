// Op layer: binary arithmetic (add, sub, mul, div, pow, maximum, minimum) in tensor-tensor and
// tensor-scalar forms. Each op's forward, dtype rule and backward formula sit together here;
// the kernels are kernels::{cpu,cuda}::binary / binary_scalar.
#include <cmath>

#include "op_util.hpp"
#include "troupe/tensors/elementwise.hpp"

namespace troupe {

namespace {
using kernels::binary_op;
using ops::reduce_grad;

bool is_integral_value(double v) { return std::isfinite(v) && v == std::floor(v); }

// Result dtype of a tensor-tensor op: PyTorch promotion; true division makes integers float32.
dtype result_dtype(binary_op op, dtype a, dtype b) {
  const dtype t = promote_types(a, b);
  if (op == binary_op::div && !is_floating(t)) return dtype::float32;
  return t;
}

// Result dtype of tensor-scalar: the tensor's, unless an integer tensor meets a non-integral
// scalar (or true division), which gives float32.
dtype scalar_result_dtype(binary_op op, dtype a, double s) {
  if (is_floating(a)) return a;
  if (op == binary_op::div || !is_integral_value(s)) return dtype::float32;
  return a == dtype::boolean ? dtype::int64 : a;
}

tensor binary_forward(const char* name, binary_op op, const tensor& a, const tensor& b, double alpha) {
  ops::check_same_device(name, a, b);
  const dtype t = result_dtype(op, a.dtype(), b.dtype());
  const shape_t shape = broadcast_shapes(a.shape(), b.shape(), name);
  const tensor x = ops::expand_to(ops::cast(a, t), shape), y = ops::expand_to(ops::cast(b, t), shape);
  tensor out = empty(shape, tensor_options(t, a.device()));
  TROUPE_DISPATCH(a.device(), binary, op, out, x, y, alpha);
  return out;
}

tensor scalar_forward(const char* name, binary_op op, const tensor& a, double s) {
  ops::check_defined(name, a);
  const dtype t = scalar_result_dtype(op, a.dtype(), s);
  const tensor x = ops::cast(a, t);
  tensor out = empty(a.shape(), tensor_options(t, a.device()));
  TROUPE_DISPATCH(a.device(), binary_scalar, op, out, x, s);
  return out;
}

// Helpers for backward formulas: g is the output gradient, undefined means "no gradient".
tensor_list none(std::size_t n) { return tensor_list(n); }
}  // namespace

tensor add(const tensor& a, const tensor& b, double alpha) {
  tensor out = binary_forward("add", binary_op::add, a, b, alpha);
  ops::record("add", {a, b}, out, {}, [sa = a.shape(), sb = b.shape(), ta = a.dtype(), tb = b.dtype(), alpha](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return none(2);
    return tensor_list{c.needs_input_grad[0] ? reduce_grad(g, sa, ta) : tensor(),
                       c.needs_input_grad[1] ? reduce_grad(alpha == 1.0 ? g : mul(g, alpha), sb, tb) : tensor()};
  });
  return out;
}

tensor sub(const tensor& a, const tensor& b, double alpha) {
  tensor out = binary_forward("sub", binary_op::sub, a, b, alpha);
  ops::record("sub", {a, b}, out, {}, [sa = a.shape(), sb = b.shape(), ta = a.dtype(), tb = b.dtype(), alpha](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return none(2);
    return tensor_list{c.needs_input_grad[0] ? reduce_grad(g, sa, ta) : tensor(),
                       c.needs_input_grad[1] ? reduce_grad(mul(g, -alpha), sb, tb) : tensor()};
  });
  return out;
}

tensor mul(const tensor& a, const tensor& b) {
  tensor out = binary_forward("mul", binary_op::mul, a, b, 1.0);
  ops::record("mul", {a, b}, out, {a, b}, [](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return none(2);
    const tensor &x = c.saved[0], &y = c.saved[1];
    return tensor_list{c.needs_input_grad[0] ? reduce_grad(mul(g, y), x.shape(), x.dtype()) : tensor(),
                       c.needs_input_grad[1] ? reduce_grad(mul(g, x), y.shape(), y.dtype()) : tensor()};
  });
  return out;
}

tensor div(const tensor& a, const tensor& b) {
  tensor out = binary_forward("div", binary_op::div, a, b, 1.0);
  ops::record("div", {a, b}, out, {a, b}, [](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return none(2);
    const tensor &x = c.saved[0], &y = c.saved[1];
    return tensor_list{c.needs_input_grad[0] ? reduce_grad(div(g, y), x.shape(), x.dtype()) : tensor(),
                       c.needs_input_grad[1] ? reduce_grad(neg(div(mul(g, x), mul(y, y))), y.shape(), y.dtype()) : tensor()};
  });
  return out;
}

tensor pow(const tensor& a, const tensor& b) {
  tensor out = binary_forward("pow", binary_op::pow, a, b, 1.0);
  ops::record("pow", {a, b}, out, {a, b}, [](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return none(2);
    const tensor &x = c.saved[0], &y = c.saved[1];
    tensor ga, gb;
    if (c.needs_input_grad[0]) ga = reduce_grad(mul(mul(g, y), pow(x, sub(y, 1.0))), x.shape(), x.dtype());
    if (c.needs_input_grad[1]) gb = reduce_grad(mul(mul(g, pow(x, y)), log(x)), y.shape(), y.dtype());
    return tensor_list{ga, gb};
  });
  return out;
}

namespace {
// maximum/minimum: the winner gets the gradient; ties split it evenly (as PyTorch).
tensor extremum(const char* name, binary_op op, const tensor& a, const tensor& b) {
  tensor out = binary_forward(name, op, a, b, 1.0);
  const bool is_max = op == binary_op::maximum;
  ops::record(name, {a, b}, out, {a, b}, [is_max](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return none(2);
    const tensor &x = c.saved[0], &y = c.saved[1];
    const tensor tie = mul(mul(g, eq(x, y)), 0.5);
    const tensor gx = add(mul(g, is_max ? gt(x, y) : lt(x, y)), tie);
    const tensor gy = add(mul(g, is_max ? lt(x, y) : gt(x, y)), tie);
    return tensor_list{c.needs_input_grad[0] ? reduce_grad(gx, x.shape(), x.dtype()) : tensor(),
                       c.needs_input_grad[1] ? reduce_grad(gy, y.shape(), y.dtype()) : tensor()};
  });
  return out;
}
}  // namespace

tensor maximum(const tensor& a, const tensor& b) { return extremum("maximum", binary_op::maximum, a, b); }
tensor minimum(const tensor& a, const tensor& b) { return extremum("minimum", binary_op::minimum, a, b); }

// ---- tensor-scalar forms ---------------------------------------------------------------------

namespace {
// Records a scalar op whose gradient is g * factor(saved a) (factor may ignore a).
template <class Factor>
void record_scalar(const char* name, const tensor& a, const tensor& out, bool save_input, Factor factor) {
  ops::record(name, {a}, out, save_input ? tensor_list{a} : tensor_list{},
              [factor, shape = a.shape(), t = a.dtype(), save_input](const backward_ctx& c) {
                const tensor& g = c.grad_outputs[0];
                if (!g.defined()) return none(1);
                return tensor_list{reduce_grad(factor(g, save_input ? c.saved[0] : tensor()), shape, t)};
              });
}
}  // namespace

tensor add(const tensor& a, double b) {
  tensor out = scalar_forward("add", binary_op::add, a, b);
  record_scalar("add", a, out, false, [](const tensor& g, const tensor&) { return g; });
  return out;
}

tensor sub(const tensor& a, double b) {
  tensor out = scalar_forward("sub", binary_op::sub, a, b);
  record_scalar("sub", a, out, false, [](const tensor& g, const tensor&) { return g; });
  return out;
}

tensor mul(const tensor& a, double b) {
  tensor out = scalar_forward("mul", binary_op::mul, a, b);
  record_scalar("mul", a, out, false, [b](const tensor& g, const tensor&) { return mul(g, b); });
  return out;
}

tensor div(const tensor& a, double b) {
  tensor out = scalar_forward("div", binary_op::div, a, b);
  record_scalar("div", a, out, false, [b](const tensor& g, const tensor&) { return div(g, b); });
  return out;
}

tensor pow(const tensor& a, double e) {
  tensor out = scalar_forward("pow", binary_op::pow, a, e);
  record_scalar("pow", a, out, true, [e](const tensor& g, const tensor& x) {
    if (e == 0.0) return mul(g, 0.0);
    return mul(mul(g, pow(x, e - 1.0)), e);
  });
  return out;
}

tensor rsub(const tensor& a, double b) {
  ops::check_defined("rsub", a);
  const dtype t = scalar_result_dtype(binary_op::sub, a.dtype(), b);
  const tensor s = ops::expand_to(scalar_tensor(b, tensor_options(t, a.device())), a.shape());
  tensor out = empty(a.shape(), tensor_options(t, a.device()));
  TROUPE_DISPATCH(a.device(), binary, binary_op::sub, out, s, ops::cast(a, t), 1.0);
  record_scalar("rsub", a, out, false, [](const tensor& g, const tensor&) { return neg(g); });
  return out;
}

tensor rdiv(const tensor& a, double b) {
  ops::check_defined("rdiv", a);
  const dtype t = scalar_result_dtype(binary_op::div, a.dtype(), b);
  const tensor s = ops::expand_to(scalar_tensor(b, tensor_options(t, a.device())), a.shape());
  tensor out = empty(a.shape(), tensor_options(t, a.device()));
  TROUPE_DISPATCH(a.device(), binary, binary_op::div, out, s, ops::cast(a, t), 1.0);
  record_scalar("rdiv", a, out, true, [b](const tensor& g, const tensor& x) { return div(mul(g, -b), mul(x, x)); });
  return out;
}

}  // namespace troupe
