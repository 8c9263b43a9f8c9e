// Op layer: index_select, gather, scatter_add, index_add (out of place), cat and stack.
// Index tensors are int32/int64, range-checked here on a host copy (index_out_of_range names
// the op, the bad index and the bound), and handed to kernels as contiguous int64.
#include <algorithm>

#include "op_util.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/nn_ops.hpp"

namespace troupe {

namespace {
// Validates `index` (dtype, device, values in [0, bound)) and returns it as contiguous int64.
tensor checked_index(const char* op, const tensor& index, const tensor& a, std::int64_t bound) {
  ops::check_same_device(op, a, index);
  if (index.dtype() != dtype::int64 && index.dtype() != dtype::int32)
    throw error(errc::dtype_mismatch, std::string(op) + ": index must be int64 or int32, got " + ops::describe(index));
  no_grad_guard ng;
  tensor idx = ops::cast(index, dtype::int64).contiguous();
  const tensor host = idx.is_cpu() ? idx : idx.cpu();
  const auto* p = static_cast<const std::int64_t*>(host.data_ptr());
  for (std::int64_t i = 0; i < host.numel(); ++i)
    if (p[i] < 0 || p[i] >= bound)
      throw error(errc::index_out_of_range, std::string(op) + ": index " + std::to_string(p[i]) + " out of range [0, " +
                                                std::to_string(bound) + ") for " + ops::describe(a));
  return idx;
}

void check_same_dtype(const char* op, const tensor& a, const tensor& b) {
  if (a.dtype() != b.dtype())
    throw error(errc::dtype_mismatch, std::string(op) + ": dtypes differ: " + ops::describe(a) + " and " + ops::describe(b));
}

// gather/scatter_add shape rule: index has a's rank; index.size(d) <= a.size(d) for d != dim.
void check_gather_shape(const char* op, const tensor& a, std::int64_t dim, const tensor& index) {
  bool ok = index.dim() == a.dim();
  for (std::int64_t d = 0; ok && d < a.dim(); ++d) ok = d == dim || index.size(d) <= a.size(d);
  if (!ok)
    throw error(errc::shape_mismatch, std::string(op) + ": index " + ops::describe(index) + " does not fit " + ops::describe(a) +
                                          " along dim " + std::to_string(dim));
}
}  // namespace

tensor index_select(const tensor& a, std::int64_t dim, const tensor& index) {
  ops::check_defined("index_select", a);
  dim = a.wrap_dim(dim);
  if (index.defined() && index.dim() > 1)
    throw error(errc::bad_argument, "index_select: index must be 1-d, got " + ops::describe(index));
  const tensor idx = checked_index("index_select", index, a, a.size(dim));
  shape_t shape = a.shape();
  shape[static_cast<std::size_t>(dim)] = idx.numel();
  tensor out = empty(shape, tensor_options(a.dtype(), a.device()));
  TROUPE_DISPATCH(a.device(), index_select, out, a, dim, idx.reshape({idx.numel()}));
  ops::record("index_select", {a}, out, {idx}, [shape = a.shape(), dim](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return tensor_list{tensor()};
    return tensor_list{index_add(zeros(shape, tensor_options(g.dtype(), g.device())), dim, c.saved[0], g)};
  });
  return out;
}

tensor gather(const tensor& a, std::int64_t dim, const tensor& index) {
  ops::check_defined("gather", a);
  dim = a.wrap_dim(dim);
  const tensor idx = checked_index("gather", index, a, a.size(dim));
  check_gather_shape("gather", a, dim, idx);
  tensor out = empty(idx.shape(), tensor_options(a.dtype(), a.device()));
  TROUPE_DISPATCH(a.device(), gather, out, a, dim, idx);
  ops::record("gather", {a}, out, {idx}, [shape = a.shape(), dim](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return tensor_list{tensor()};
    return tensor_list{scatter_add(zeros(shape, tensor_options(g.dtype(), g.device())), dim, c.saved[0], g)};
  });
  return out;
}

tensor scatter_add(const tensor& a, std::int64_t dim, const tensor& index, const tensor& src) {
  ops::check_same_device("scatter_add", a, src);
  check_same_dtype("scatter_add", a, src);
  dim = a.wrap_dim(dim);
  const tensor idx = checked_index("scatter_add", index, a, a.size(dim));
  check_gather_shape("scatter_add", a, dim, idx);
  check_gather_shape("scatter_add", src, dim, idx);
  if (idx.dim() > 0 && idx.size(dim) > src.size(dim))
    throw error(errc::shape_mismatch, "scatter_add: index " + ops::describe(idx) + " larger than src " + ops::describe(src));
  tensor out = a.detach().clone();
  TROUPE_DISPATCH(a.device(), scatter_add, out, dim, idx, src);
  ops::record("scatter_add", {a, src}, out, {idx}, [ss = src.shape(), dim](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return tensor_list(2);
    tensor gs;
    if (c.needs_input_grad[1]) {
      const tensor& ix = c.saved[0];
      gs = zeros(ss, tensor_options(g.dtype(), g.device()));
      tensor region = gs;  // the part of src that index covers
      for (std::int64_t d = 0; d < ix.dim(); ++d) region = region.narrow(d, 0, ix.size(d));
      region.copy_(gather(g, dim, ix));
    }
    return tensor_list{c.needs_input_grad[0] ? g : tensor(), gs};
  });
  return out;
}

tensor index_add(const tensor& a, std::int64_t dim, const tensor& index, const tensor& src) {
  ops::check_same_device("index_add", a, src);
  check_same_dtype("index_add", a, src);
  dim = a.wrap_dim(dim);
  if (index.defined() && index.dim() > 1)
    throw error(errc::bad_argument, "index_add: index must be 1-d, got " + ops::describe(index));
  const tensor idx = checked_index("index_add", index, a, a.size(dim));
  shape_t want = a.shape();
  want[static_cast<std::size_t>(dim)] = idx.numel();
  if (src.shape() != want)
    throw error(errc::shape_mismatch, "index_add: src " + ops::describe(src) + " must have shape " + shape_to_string(want));
  tensor out = a.detach().clone();
  TROUPE_DISPATCH(a.device(), index_add, out, dim, idx.reshape({idx.numel()}), src);
  ops::record("index_add", {a, src}, out, {idx}, [dim](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    if (!g.defined()) return tensor_list(2);
    return tensor_list{c.needs_input_grad[0] ? g : tensor(), c.needs_input_grad[1] ? index_select(g, dim, c.saved[0]) : tensor()};
  });
  return out;
}

tensor cat(const tensor_list& tensors, std::int64_t dim) {
  if (tensors.empty()) throw error(errc::bad_argument, "cat: expects a non-empty list of tensors");
  const tensor& first = tensors[0];
  ops::check_defined("cat", first);
  dim = first.wrap_dim(dim);
  dtype t = first.dtype();
  std::int64_t total = 0;
  for (const auto& x : tensors) {
    ops::check_same_device("cat", first, x);
    bool ok = x.dim() == first.dim();
    for (std::int64_t d = 0; ok && d < x.dim(); ++d) ok = d == dim || x.size(d) == first.size(d);
    if (!ok)
      throw error(errc::shape_mismatch, "cat: " + ops::describe(x) + " does not match " + ops::describe(first) +
                                            " outside dim " + std::to_string(dim));
    t = promote_types(t, x.dtype());
    total += x.size(dim);
  }
  shape_t shape = first.shape();
  shape[static_cast<std::size_t>(dim)] = total;
  tensor out = empty(shape, tensor_options(t, first.device()));
  std::vector<std::int64_t> starts;
  std::int64_t at = 0;
  for (const auto& x : tensors) {
    no_grad_guard ng;
    starts.push_back(at);
    TROUPE_DISPATCH(out.device(), copy, out.narrow(dim, at, x.size(dim)), x);
    at += x.size(dim);
  }
  std::vector<std::pair<std::int64_t, dtype>> parts;
  for (const auto& x : tensors) parts.emplace_back(x.size(dim), x.dtype());
  ops::record("cat", tensors, out, {}, [dim, starts, parts](const backward_ctx& c) {
    const tensor& g = c.grad_outputs[0];
    tensor_list grads(parts.size());
    if (!g.defined()) return grads;
    for (std::size_t i = 0; i < parts.size(); ++i)
      if (c.needs_input_grad[i]) grads[i] = ops::cast(g.narrow(dim, starts[i], parts[i].first).contiguous(), parts[i].second);
    return grads;
  });
  return out;
}

tensor stack(const tensor_list& tensors, std::int64_t dim) {
  if (tensors.empty()) throw error(errc::bad_argument, "stack: expects a non-empty list of tensors");
  ops::check_defined("stack", tensors[0]);
  dim = tensors[0].wrap_dim(dim, true);
  tensor_list parts;
  for (const auto& x : tensors) {
    ops::check_defined("stack", x);
    if (x.shape() != tensors[0].shape())
      throw error(errc::shape_mismatch, "stack: " + ops::describe(x) + " differs in shape from " + ops::describe(tensors[0]));
    parts.push_back(x.unsqueeze(dim));
  }
  return cat(parts, dim);
}

}  // namespace troupe
