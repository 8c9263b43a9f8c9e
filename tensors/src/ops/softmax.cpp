// Op layer: softmax and log_softmax (numerically stable; kernels subtract the slice maximum).
// Backward (y recomputed from the saved input, so the output is not kept alive by its node):
//   softmax:     dx = y * (g - sum(g * y, dim))
//   log_softmax: dx = g - softmax(x) * sum(g, dim)
#include "op_util.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/nn_ops.hpp"

namespace troupe {

namespace {
tensor softmax_forward(const char* name, const tensor& a, std::int64_t dim, bool log) {
  ops::check_defined(name, a);
  if (!is_floating(a.dtype()))
    throw error(errc::dtype_mismatch, std::string(name) + ": input must be floating point, got " + ops::describe(a));
  tensor out = empty(a.shape(), tensor_options(a.dtype(), a.device()));
  if (a.dim() == 0) {  // a single element: softmax 1, log_softmax 0
    out.fill_(log ? 0.0 : 1.0);
    return out;
  }
  TROUPE_DISPATCH(a.device(), softmax, out, a, dim, log);
  return out;
}
}  // namespace

tensor softmax(const tensor& a, std::int64_t dim) {
  ops::check_defined("softmax", a);
  dim = a.dim() == 0 ? 0 : a.wrap_dim(dim);
  tensor out = softmax_forward("softmax", a, dim, false);
  ops::record("softmax", {a}, out, {a}, [dim](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return tensor_list{tensor()};
    const tensor& x = c.saved[0];
    if (x.dim() == 0) return tensor_list{mul(g, 0.0)};
    const tensor y = softmax(x, dim);
    return tensor_list{mul(y, sub(g, sum(mul(g, y), {dim}, true)))};
  });
  return out;
}

tensor log_softmax(const tensor& a, std::int64_t dim) {
  ops::check_defined("log_softmax", a);
  dim = a.dim() == 0 ? 0 : a.wrap_dim(dim);
  tensor out = softmax_forward("log_softmax", a, dim, true);
  ops::record("log_softmax", {a}, out, {a}, [dim](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return tensor_list{tensor()};
    const tensor& x = c.saved[0];
    if (x.dim() == 0) return tensor_list{mul(g, 0.0)};
    return tensor_list{sub(g, mul(softmax(x, dim), sum(g, {dim}, true)))};
  });
  return out;
}

}  // namespace troupe
