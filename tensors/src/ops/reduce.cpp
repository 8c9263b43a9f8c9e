// Op layer: reductions (sum, mean, amax, amin, var, argmax, argmin) and sum_to.
// Outputs are allocated in their final shape; kernels get a keepdim view of them.
// Zero-size: sum of empty = 0, mean of empty = NaN, amax/amin/argmax of an empty slice throw
// bad_argument.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "op_util.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/nn_ops.hpp"
#include "troupe/tensors/reduction.hpp"

namespace troupe {

namespace ops {
shape_t normalize_dims(const char* op, const tensor& a, const shape_t& dims) {
  shape_t out;
  if (dims.empty()) {
    out.resize(static_cast<std::size_t>(a.dim()));
    std::iota(out.begin(), out.end(), 0);
    return out;
  }
  for (auto d : dims) out.push_back(a.wrap_dim(d));
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end())
    throw error(errc::bad_argument, std::string(op) + ": repeated dim in " + shape_to_string(dims) + " for " + describe(a));
  return out;
}

shape_t reduced_shape(const shape_t& sizes, const shape_t& dims, bool keepdim) {
  shape_t out;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    const bool reduced = std::binary_search(dims.begin(), dims.end(), static_cast<std::int64_t>(d));
    if (!reduced) out.push_back(sizes[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}
}  // namespace ops

namespace {
using kernels::reduce_op;

std::int64_t reduced_count(const tensor& a, const shape_t& dims) {
  std::int64_t n = 1;
  for (auto d : dims) n *= a.size(d);
  return n;
}

// Runs the reduce kernel: input of dtype t, output shaped per keepdim.
tensor reduce_forward(const char* name, reduce_op op, const tensor& a, const shape_t& dims, bool keepdim, dtype t) {
  const tensor x = ops::cast(a, t);
  tensor out = empty(ops::reduced_shape(a.shape(), dims, keepdim), tensor_options(t, a.device()));
  if (dims.empty()) {  // 0-d input: nothing to fold
    TROUPE_DISPATCH(a.device(), copy, out, x);
    return out;
  }
  const tensor kd = ops::raw_view(out, ops::reduced_shape(a.shape(), dims, true));
  TROUPE_DISPATCH(a.device(), reduce, op, kd, x, dims);
  return out;
}

// The output gradient broadcast back over the reduced dims of an input of shape `in`.
tensor expand_grad(const tensor& g, const shape_t& in, const shape_t& dims) {
  return g.reshape(ops::reduced_shape(in, dims, true)).expand(in);
}
}  // namespace

tensor sum(const tensor& a, shape_t dims, bool keepdim) {
  ops::check_defined("sum", a);
  dims = ops::normalize_dims("sum", a, dims);
  const dtype t = is_floating(a.dtype()) ? a.dtype() : dtype::int64;
  tensor out = reduce_forward("sum", reduce_op::sum, a, dims, keepdim, t);
  ops::record("sum", {a}, out, {}, [in = a.shape(), ta = a.dtype(), dims](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return tensor_list{tensor()};
    return tensor_list{ops::cast(expand_grad(g, in, dims).contiguous(), ta)};
  });
  return out;
}

tensor mean(const tensor& a, shape_t dims, bool keepdim) {
  ops::check_defined("mean", a);
  if (!is_floating(a.dtype()))
    throw error(errc::dtype_mismatch, "mean: input must be floating point, got " + ops::describe(a));
  dims = ops::normalize_dims("mean", a, dims);
  tensor out = reduce_forward("mean", reduce_op::mean, a, dims, keepdim, a.dtype());
  const auto count = static_cast<double>(reduced_count(a, dims));
  ops::record("mean", {a}, out, {}, [in = a.shape(), dims, count](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return tensor_list{tensor()};
    return tensor_list{div(expand_grad(g, in, dims), count)};
  });
  return out;
}

namespace {
// Gradient of amax/amin: all of g goes to the first extremal element of each slice (the one
// argmax/argmin picks over the slice flattened in row-major order); ties get nothing.
tensor first_extremum_grad(const tensor& g, const tensor& x, const shape_t& dims, bool is_max) {
  shape_t perm, kept, red, inverse(static_cast<std::size_t>(x.dim()));
  for (std::int64_t d = 0; d < x.dim(); ++d)
    if (!std::binary_search(dims.begin(), dims.end(), d)) { perm.push_back(d); kept.push_back(x.size(d)); }
  for (auto d : dims) { perm.push_back(d); red.push_back(x.size(d)); }
  for (std::size_t i = 0; i < perm.size(); ++i) inverse[static_cast<std::size_t>(perm[i])] = static_cast<std::int64_t>(i);
  shape_t flat = kept;
  flat.push_back(numel_of(red));
  const tensor xf = x.permute(perm).reshape(flat);
  const tensor idx = is_max ? argmax(xf, -1, true) : argmin(xf, -1, true);
  shape_t gshape = kept;
  gshape.push_back(1);
  tensor z = scatter_add(zeros(flat, tensor_options(g.dtype(), g.device())), -1, idx, g.reshape(gshape));
  shape_t full = kept;
  full.insert(full.end(), red.begin(), red.end());
  return z.reshape(full).permute(inverse).contiguous();
}

tensor extremum(const char* name, reduce_op op, const tensor& a, shape_t dims, bool keepdim) {
  ops::check_defined(name, a);
  dims = ops::normalize_dims(name, a, dims);
  if (reduced_count(a, dims) == 0)
    throw error(errc::bad_argument, std::string(name) + ": reduction over an empty dimension of " + ops::describe(a));
  tensor out = reduce_forward(name, op, a, dims, keepdim, a.dtype());
  const bool is_max = op == reduce_op::max;
  ops::record(name, {a}, out, {a}, [dims, is_max](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return tensor_list{tensor()};
    const tensor& x = c.saved[0];
    if (dims.empty()) return tensor_list{g.reshape(x.shape())};
    return tensor_list{first_extremum_grad(g, x, dims, is_max)};
  });
  return out;
}
}  // namespace

tensor amax(const tensor& a, shape_t dims, bool keepdim) { return extremum("amax", reduce_op::max, a, std::move(dims), keepdim); }
tensor amin(const tensor& a, shape_t dims, bool keepdim) { return extremum("amin", reduce_op::min, a, std::move(dims), keepdim); }

namespace {
tensor arg_extremum(const char* name, bool is_max, const tensor& a, std::int64_t dim, bool keepdim) {
  ops::check_defined(name, a);
  if (a.dim() == 0) return zeros({}, tensor_options(dtype::int64, a.device()));
  dim = a.wrap_dim(dim);
  if (a.size(dim) == 0)
    throw error(errc::bad_argument, std::string(name) + ": empty dimension " + std::to_string(dim) + " of " + ops::describe(a));
  const shape_t dims{dim};
  tensor out = empty(ops::reduced_shape(a.shape(), dims, keepdim), tensor_options(dtype::int64, a.device()));
  TROUPE_DISPATCH(a.device(), arg_reduce, is_max, ops::raw_view(out, ops::reduced_shape(a.shape(), dims, true)), a, dim);
  return out;
}
}  // namespace

tensor argmax(const tensor& a, std::int64_t dim, bool keepdim) { return arg_extremum("argmax", true, a, dim, keepdim); }
tensor argmin(const tensor& a, std::int64_t dim, bool keepdim) { return arg_extremum("argmin", false, a, dim, keepdim); }
tensor argmax(const tensor& a) {
  ops::check_defined("argmax", a);
  no_grad_guard g;
  return arg_extremum("argmax", true, a.reshape({-1}), 0, false);
}

tensor var(const tensor& a, shape_t dims, bool unbiased, bool keepdim) {
  ops::check_defined("var", a);
  if (!is_floating(a.dtype()))
    throw error(errc::dtype_mismatch, "var: input must be floating point, got " + ops::describe(a));
  dims = ops::normalize_dims("var", a, dims);
  const std::int64_t correction = unbiased ? 1 : 0;
  tensor out = empty(ops::reduced_shape(a.shape(), dims, keepdim), tensor_options(a.dtype(), a.device()));
  const tensor kd = ops::raw_view(out, ops::reduced_shape(a.shape(), dims, true));
  if (dims.empty()) {
    TROUPE_DISPATCH(a.device(), fill, kd, unbiased ? std::nan("") : 0.0);
  } else {
    TROUPE_DISPATCH(a.device(), var, kd, a, dims, correction);
  }
  const double denom = static_cast<double>(reduced_count(a, dims) - correction);
  ops::record("var", {a}, out, {a}, [dims, denom](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return tensor_list{tensor()};
    const tensor& x = c.saved[0];
    const tensor centred = sub(x, mean(x, dims, true));
    return tensor_list{mul(expand_grad(g, x.shape(), dims), mul(centred, 2.0 / denom))};
  });
  return out;
}

tensor sum_to(const tensor& a, const shape_t& shape) {
  ops::check_defined("sum_to", a);
  if (a.shape() == shape) return a;
  const auto lead = static_cast<std::int64_t>(a.dim()) - static_cast<std::int64_t>(shape.size());
  if (lead < 0)
    throw error(errc::shape_mismatch, "sum_to: cannot sum " + ops::describe(a) + " to the larger shape " + shape_to_string(shape));
  shape_t dims;
  for (std::int64_t d = 0; d < a.dim(); ++d) {
    if (d < lead) { dims.push_back(d); continue; }
    const std::int64_t want = shape[static_cast<std::size_t>(d - lead)];
    if (want == a.size(d)) continue;
    if (want != 1)
      throw error(errc::shape_mismatch, "sum_to: " + ops::describe(a) + " does not broadcast from " + shape_to_string(shape));
    dims.push_back(d);
  }
  if (dims.empty()) return a.reshape(shape);
  return sum(a, dims, true).reshape(shape);
}

}  // namespace troupe
