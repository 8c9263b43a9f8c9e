// Op layer: unary elementwise ops. Transcendental ops (exp, log, sqrt, rsqrt, sigmoid, tanh,
// gelu) turn integer inputs into float32 as PyTorch does; neg/abs/relu/sign keep the dtype.
// Backward formulas recompute from the saved input rather than saving the output, so no
// output is kept alive by its own graph node.
#include <cmath>

#include "op_util.hpp"
#include "troupe/tensors/elementwise.hpp"

namespace troupe {

namespace {
using kernels::unary_op;

bool keeps_dtype(unary_op op) {
  return op == unary_op::neg || op == unary_op::abs || op == unary_op::relu || op == unary_op::sign;
}

tensor unary_forward(const char* name, unary_op op, const tensor& a) {
  ops::check_defined(name, a);
  if (op == unary_op::neg && a.dtype() == dtype::boolean)
    throw error(errc::dtype_mismatch, "neg: negation of a bool tensor is not supported (" + ops::describe(a) + ")");
  const dtype t = keeps_dtype(op) || is_floating(a.dtype()) ? a.dtype() : dtype::float32;
  tensor out = empty(a.shape(), tensor_options(t, a.device()));
  TROUPE_DISPATCH(a.device(), unary, op, out, ops::cast(a, t));
  return out;
}

// Forward plus a backward of the form grad_input = deriv(g, saved input).
template <class Deriv>
tensor unary_op_with_grad(const char* name, unary_op op, const tensor& a, Deriv deriv) {
  tensor out = unary_forward(name, op, a);
  ops::record(name, {a}, out, {a}, [deriv](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return tensor_list{tensor()};
    const tensor& x = c.saved[0];
    return tensor_list{ops::cast(deriv(g, x), x.dtype())};
  });
  return out;
}
}  // namespace

tensor neg(const tensor& a) {
  return unary_op_with_grad("neg", unary_op::neg, a, [](const tensor& g, const tensor&) { return neg(g); });
}
tensor abs(const tensor& a) {
  return unary_op_with_grad("abs", unary_op::abs, a, [](const tensor& g, const tensor& x) { return mul(g, sign(x)); });
}
tensor exp(const tensor& a) {
  return unary_op_with_grad("exp", unary_op::exp, a, [](const tensor& g, const tensor& x) { return mul(g, exp(x)); });
}
tensor log(const tensor& a) {
  return unary_op_with_grad("log", unary_op::log, a, [](const tensor& g, const tensor& x) { return div(g, x); });
}
tensor sqrt(const tensor& a) {
  return unary_op_with_grad("sqrt", unary_op::sqrt, a,
                            [](const tensor& g, const tensor& x) { return div(g, mul(sqrt(x), 2.0)); });
}
tensor rsqrt(const tensor& a) {
  return unary_op_with_grad("rsqrt", unary_op::rsqrt, a,
                            [](const tensor& g, const tensor& x) { return mul(mul(g, pow(x, -1.5)), -0.5); });
}
tensor relu(const tensor& a) {
  return unary_op_with_grad("relu", unary_op::relu, a, [](const tensor& g, const tensor& x) { return mul(g, gt(x, 0.0)); });
}
tensor sigmoid(const tensor& a) {
  return unary_op_with_grad("sigmoid", unary_op::sigmoid, a, [](const tensor& g, const tensor& x) {
    const tensor s = sigmoid(x);
    return mul(g, mul(s, rsub(s, 1.0)));
  });
}
tensor tanh(const tensor& a) {
  return unary_op_with_grad("tanh", unary_op::tanh, a, [](const tensor& g, const tensor& x) {
    const tensor t = tanh(x);
    return mul(g, rsub(mul(t, t), 1.0));
  });
}
// d/dx x*Phi(x) = Phi(x) + x*phi(x); Phi(x) is recovered as gelu(x)/x (1/2 at x = 0), which
// needs no erf op of its own.
tensor gelu(const tensor& a) {
  return unary_op_with_grad("gelu", unary_op::gelu, a, [](const tensor& g, const tensor& x) {
    const tensor zero = eq(x, 0.0);
    const tensor cdf = where(zero, scalar_tensor(0.5, tensor_options(x.dtype(), x.device())), div(gelu(x), x));
    const tensor pdf = mul(exp(mul(mul(x, x), -0.5)), 0.39894228040143267794);
    return mul(g, add(cdf, mul(x, pdf)));
  });
}
tensor sign(const tensor& a) {
  return unary_op_with_grad("sign", unary_op::sign, a, [](const tensor& g, const tensor&) { return mul(g, 0.0); });
}

}  // namespace troupe
