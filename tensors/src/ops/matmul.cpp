// Op layer: matmul (torch.matmul semantics), bmm and addmm. All reduce to the 3-d gemm kernel
// [B, n, k] x [B, k, m] -> [B, n, m]. Batch dims are broadcast with 0-strides, without copies.
// The output is allocated uninitialised in its final shape; the kernel writes a 3-d view of it.
#include "op_util.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/linalg.hpp"

namespace troupe {

namespace {
void check_operands(const char* op, const tensor& a, const tensor& b) {
  ops::check_same_device(op, a, b);
  if (a.dtype() != b.dtype())
    throw error(errc::dtype_mismatch, std::string(op) + ": operands have different dtypes: " + ops::describe(a) + " and " + ops::describe(b));
  if (a.dim() == 0 || b.dim() == 0)
    throw error(errc::shape_mismatch, std::string(op) + ": both operands need at least 1 dim, got " + ops::describe(a) + " and " + ops::describe(b));
}

[[noreturn]] void inner_mismatch(const char* op, const tensor& a, const tensor& b) {
  throw error(errc::shape_mismatch, std::string(op) + ": inner dimensions do not match: " + ops::describe(a) + " @ " + ops::describe(b));
}

// The product of a2 [..., n, k] and b2 [..., k, m], both at least 2-d. Its shape is
// batch + [n, m], less the dims that a 1-d a or b did not have.
tensor batched_product(const char* op, const tensor& a2, const tensor& b2, const tensor& a, const tensor& b) {
  const std::int64_t n = a2.size(-2), k = a2.size(-1), m = b2.size(-1);
  if (b2.size(-2) != k) inner_mismatch(op, a, b);
  const shape_t ab(a2.shape().begin(), a2.shape().end() - 2), bb(b2.shape().begin(), b2.shape().end() - 2);
  const shape_t batch = broadcast_shapes(ab, bb, op);
  const std::int64_t nb = numel_of(batch);
  shape_t a_full = batch, b_full = batch;
  a_full.insert(a_full.end(), {n, k});
  b_full.insert(b_full.end(), {k, m});
  // the final shape drops the n = 1 of a 1-d a and the m = 1 of a 1-d b
  shape_t final_shape = batch;
  if (a.dim() != 1) final_shape.push_back(n);
  if (b.dim() != 1) final_shape.push_back(m);
  no_grad_guard ng;
  const tensor a3 = a2.expand(a_full).reshape({nb, n, k});
  const tensor b3 = b2.expand(b_full).reshape({nb, k, m});
  tensor out = empty(final_shape, tensor_options(a.dtype(), a.device()));
  TROUPE_DISPATCH(a.device(), gemm, ops::raw_view(out, {nb, n, m}), a3, b3, 1.0, 0.0);
  return out;
}

tensor matmul_forward(const tensor& a, const tensor& b) {
  check_operands("matmul", a, b);
  no_grad_guard ng;
  const tensor a2 = a.dim() == 1 ? a.unsqueeze(0) : a;
  const tensor b2 = b.dim() == 1 ? b.unsqueeze(1) : b;
  return batched_product("matmul", a2, b2, a, b);
}
}  // namespace

tensor matmul(const tensor& a, const tensor& b) {
  tensor out = matmul_forward(a, b);
  ops::record("matmul", {a, b}, out, {a, b}, [](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return tensor_list(2);
    const tensor &x = c.saved[0], &y = c.saved[1];
    const tensor x2 = x.dim() == 1 ? x.unsqueeze(0) : x;
    const tensor y2 = y.dim() == 1 ? y.unsqueeze(1) : y;
    // g with the dims a 1-d operand did not have put back: batch + [n, m]
    const shape_t ab(x2.shape().begin(), x2.shape().end() - 2), bb(y2.shape().begin(), y2.shape().end() - 2);
    shape_t gshape = broadcast_shapes(ab, bb, "matmul backward");
    gshape.insert(gshape.end(), {x2.size(-2), y2.size(-1)});
    const tensor g2 = g.reshape(gshape);
    tensor gx, gy;
    if (c.needs_input_grad[0]) gx = ops::reduce_grad(matmul(g2, y2.transpose(-1, -2)), x2.shape(), x.dtype()).reshape(x.shape());
    if (c.needs_input_grad[1]) gy = ops::reduce_grad(matmul(x2.transpose(-1, -2), g2), y2.shape(), y.dtype()).reshape(y.shape());
    return tensor_list{gx, gy};
  });
  return out;
}

tensor bmm(const tensor& a, const tensor& b) {
  check_operands("bmm", a, b);
  if (a.dim() != 3 || b.dim() != 3 || a.size(0) != b.size(0))
    throw error(errc::shape_mismatch, "bmm: expects [B, n, k] and [B, k, m], got " + ops::describe(a) + " and " + ops::describe(b));
  if (a.size(2) != b.size(1)) inner_mismatch("bmm", a, b);
  return matmul(a, b);
}

tensor addmm(const tensor& c, const tensor& a, const tensor& b, double beta, double alpha) {
  check_operands("addmm", a, b);
  ops::check_same_device("addmm", c, a);
  if (a.dim() != 2 || b.dim() != 2)
    throw error(errc::shape_mismatch, "addmm: expects 2-d operands, got " + ops::describe(a) + " and " + ops::describe(b));
  if (a.size(1) != b.size(0)) inner_mismatch("addmm", a, b);
  const shape_t shape{a.size(0), b.size(1)};
  if (broadcast_shapes(c.shape(), shape, "addmm") != shape)
    throw error(errc::shape_mismatch, "addmm: " + ops::describe(c) + " does not broadcast to " + shape_to_string(shape));
  tensor out = empty(shape, tensor_options(a.dtype(), a.device()));
  if (beta != 0.0) TROUPE_DISPATCH(a.device(), copy, out, ops::expand_to(c, shape));
  {
    no_grad_guard ng;
    TROUPE_DISPATCH(a.device(), gemm, ops::raw_view(out, {1, shape[0], shape[1]}), a.unsqueeze(0), b.unsqueeze(0), alpha, beta);
  }
  ops::record("addmm", {c, a, b}, out, {a, b}, [cs = c.shape(), ct = c.dtype(), beta, alpha](const backward_ctx& ctx) {
    const tensor& g = ctx.grad_outputs[0];
    if (!g.defined()) return tensor_list(3);
    const tensor &x = ctx.saved[0], &y = ctx.saved[1];
    tensor gc, gx, gy;
    if (ctx.needs_input_grad[0]) gc = ops::reduce_grad(beta == 1.0 ? g : mul(g, beta), cs, ct);
    if (ctx.needs_input_grad[1]) gx = matmul(alpha == 1.0 ? g : mul(g, alpha), y.t());
    if (ctx.needs_input_grad[2]) gy = matmul(x.t(), alpha == 1.0 ? g : mul(g, alpha));
    return tensor_list{gc, gx, gy};
  });
  return out;
}

}  // namespace troupe
