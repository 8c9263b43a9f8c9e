// View methods of tensor: new geometry over the same storage. Views record autograd like any op
// (Note [Op recording]).
#include <algorithm>
#include <functional>

#include "record_view.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/reduction.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe {

namespace detail {

void record_view(const char* name, const tensor& in, const tensor& out,
                 std::function<tensor(const tensor&)> grad_fn) {
  if (!should_record({&in})) return;
  op_record rec;
  rec.name = name;
  rec.inputs = {in};
  rec.outputs = {out};
  rec.backward = [g = std::move(grad_fn)](const backward_ctx& ctx) -> tensor_list {
    if (!ctx.grad_outputs[0].defined()) return {tensor()};
    return {g(ctx.grad_outputs[0])};
  };
  record_op(std::move(rec));
}

}  // namespace detail

namespace {

// Gradient of a slice-like view: zeros of the input's shape with the gradient written through
// the same view.
tensor scatter_into_zeros(const tensor& grad, const shape_t& in_shape,
                          const std::function<tensor(const tensor&)>& same_view) {
  tensor z = zeros(in_shape, tensor_options(grad.dtype(), grad.device()));
  same_view(z).copy_(grad);
  return z;
}

shape_t infer_shape(shape_t shape, std::int64_t numel, const tensor& t) {
  std::int64_t known = 1, infer = -1;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) throw error(errc::bad_argument, "view: only one dimension can be -1, got " + shape_to_string(shape));
      infer = static_cast<std::int64_t>(i);
    } else if (shape[i] < 0) {
      throw error(errc::bad_argument, "view: invalid size in " + shape_to_string(shape));
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      throw error(errc::shape_mismatch, "view: shape " + shape_to_string(shape) + " is invalid for input of shape " +
                                            shape_to_string(t.shape()));
    shape[static_cast<std::size_t>(infer)] = numel / known;
  } else if (known != numel) {
    throw error(errc::shape_mismatch, "view: shape " + shape_to_string(shape) + " is invalid for input of shape " +
                                          shape_to_string(t.shape()) + " (" + std::to_string(numel) + " elements)");
  }
  return shape;
}

// Strides for viewing (sizes, strides) as new_sizes without copying, if possible
// (PyTorch's computeStride: each chunk of contiguous-compatible old dims maps onto new dims).
bool compute_view_strides(const shape_t& sizes, const shape_t& strides, const shape_t& new_sizes, shape_t& out) {
  out.assign(new_sizes.size(), 0);
  if (sizes.empty()) { std::fill(out.begin(), out.end(), 1); return true; }
  if (numel_of(sizes) == 0) { out = contiguous_strides(new_sizes); return true; }
  std::int64_t view_d = static_cast<std::int64_t>(new_sizes.size()) - 1;
  std::int64_t chunk_base_stride = strides.back();
  std::int64_t tensor_numel = 1, view_numel = 1;
  for (std::int64_t d = static_cast<std::int64_t>(sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= sizes[static_cast<std::size_t>(d)];
    if (d == 0 || (sizes[static_cast<std::size_t>(d - 1)] != 1 &&
                   strides[static_cast<std::size_t>(d - 1)] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[static_cast<std::size_t>(view_d)] == 1)) {
        out[static_cast<std::size_t>(view_d)] = view_numel * chunk_base_stride;
        view_numel *= new_sizes[static_cast<std::size_t>(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base_stride = strides[static_cast<std::size_t>(d - 1)];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  return view_d == -1;
}

}  // namespace

tensor tensor::view(shape_t shape) const {
  shape = infer_shape(std::move(shape), numel(), *this);
  shape_t st;
  if (!compute_view_strides(sizes(), strides(), shape, st))
    throw error(errc::invalid_view, "view: cannot view a tensor of shape " + shape_to_string(sizes()) + " and strides " +
                                        shape_to_string(strides()) + " as " + shape_to_string(shape) +
                                        " without copying; use reshape() or contiguous() first");
  tensor out = make_view(*this, shape, std::move(st), storage_offset());
  detail::record_view("view", *this, out, [in = sizes()](const tensor& g) { return g.reshape(in); });
  return out;
}

tensor tensor::reshape(shape_t shape) const {
  shape = infer_shape(std::move(shape), numel(), *this);
  shape_t st;
  if (compute_view_strides(sizes(), strides(), shape, st)) return view(std::move(shape));
  return contiguous().view(std::move(shape));
}

tensor tensor::transpose(std::int64_t d0, std::int64_t d1) const {
  d0 = wrap_dim(d0);
  d1 = wrap_dim(d1);
  shape_t sz = sizes(), st = strides();
  std::swap(sz[static_cast<std::size_t>(d0)], sz[static_cast<std::size_t>(d1)]);
  std::swap(st[static_cast<std::size_t>(d0)], st[static_cast<std::size_t>(d1)]);
  tensor out = make_view(*this, std::move(sz), std::move(st), storage_offset());
  detail::record_view("transpose", *this, out, [d0, d1](const tensor& g) { return g.transpose(d0, d1); });
  return out;
}

tensor tensor::t() const {
  if (dim() > 2) throw error(errc::bad_argument, "t(): expects a tensor with <= 2 dims, got shape " + shape_to_string(shape()));
  return dim() < 2 ? *this : transpose(0, 1);
}

tensor tensor::permute(shape_t dims) const {
  if (static_cast<std::int64_t>(dims.size()) != dim())
    throw error(errc::bad_argument, "permute: got " + std::to_string(dims.size()) + " dims for a tensor of shape " + shape_to_string(shape()));
  shape_t sz(dims.size()), st(dims.size()), inverse(dims.size(), -1);
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const auto d = static_cast<std::size_t>(wrap_dim(dims[i]));
    if (inverse[d] != -1) throw error(errc::bad_argument, "permute: repeated dim in " + shape_to_string(dims));
    inverse[d] = static_cast<std::int64_t>(i);
    sz[i] = sizes()[d];
    st[i] = strides()[d];
  }
  tensor out = make_view(*this, std::move(sz), std::move(st), storage_offset());
  detail::record_view("permute", *this, out, [inverse](const tensor& g) { return g.permute(inverse); });
  return out;
}

tensor tensor::slice(std::int64_t d, std::int64_t start, std::int64_t end, std::int64_t step) const {
  d = wrap_dim(d);
  if (step <= 0) throw error(errc::bad_argument, "slice: step must be positive, got " + std::to_string(step));
  const std::int64_t n = size(d);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<std::int64_t>(start, 0, n);
  end = std::clamp<std::int64_t>(end, start, n);
  shape_t sz = sizes(), st = strides();
  sz[static_cast<std::size_t>(d)] = (end - start + step - 1) / step;
  st[static_cast<std::size_t>(d)] *= step;
  tensor out = make_view(*this, std::move(sz), std::move(st), storage_offset() + start * stride(d));
  detail::record_view("slice", *this, out, [in = sizes(), d, start, end, step](const tensor& g) {
    return scatter_into_zeros(g, in, [&](const tensor& z) { return z.slice(d, start, end, step); });
  });
  return out;
}

tensor tensor::narrow(std::int64_t d, std::int64_t start, std::int64_t length) const {
  d = wrap_dim(d);
  const std::int64_t n = size(d);
  if (start < 0) start += n;
  if (start < 0 || length < 0 || start + length > n)
    throw error(errc::index_out_of_range, "narrow: start " + std::to_string(start) + " length " + std::to_string(length) +
                                              " out of range for dim " + std::to_string(d) + " of shape " + shape_to_string(shape()));
  return slice(d, start, start + length, 1);
}

tensor tensor::select(std::int64_t d, std::int64_t index) const {
  d = wrap_dim(d);
  const std::int64_t n = size(d);
  if (index < -n || index >= n)
    throw error(errc::index_out_of_range, "select: index " + std::to_string(index) + " out of range for dim " +
                                              std::to_string(d) + " of shape " + shape_to_string(shape()));
  if (index < 0) index += n;
  shape_t sz = sizes(), st = strides();
  const std::int64_t off = storage_offset() + index * st[static_cast<std::size_t>(d)];
  sz.erase(sz.begin() + d);
  st.erase(st.begin() + d);
  tensor out = make_view(*this, std::move(sz), std::move(st), off);
  detail::record_view("select", *this, out, [in = sizes(), d, index](const tensor& g) {
    return scatter_into_zeros(g, in, [&](const tensor& z) { return z.select(d, index); });
  });
  return out;
}

tensor tensor::expand(shape_t shape) const {
  if (shape.size() < sizes().size())
    throw error(errc::shape_mismatch, "expand: target " + shape_to_string(shape) + " has fewer dims than " + shape_to_string(sizes()));
  const std::size_t lead = shape.size() - sizes().size();
  shape_t st(shape.size(), 0);
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      if (shape[i] < 0) throw error(errc::bad_argument, "expand: -1 not allowed for a new leading dim in " + shape_to_string(shape));
      continue;
    }
    const std::int64_t cur = sizes()[i - lead];
    if (shape[i] == -1) shape[i] = cur;
    if (cur == shape[i]) st[i] = strides()[i - lead];
    else if (cur == 1) st[i] = 0;
    else throw error(errc::shape_mismatch, "expand: cannot expand " + shape_to_string(sizes()) + " to " + shape_to_string(shape));
  }
  tensor out = make_view(*this, shape, std::move(st), storage_offset());
  detail::record_view("expand", *this, out, [in = sizes()](const tensor& g) { return sum_to(g, in); });
  return out;
}

tensor tensor::squeeze() const {
  shape_t sz;
  for (auto s : sizes()) if (s != 1) sz.push_back(s);
  return sz.size() == sizes().size() ? view(sizes()) : view(std::move(sz));
}

tensor tensor::squeeze(std::int64_t d) const {
  d = wrap_dim(d);
  if (dim() == 0 || size(d) != 1) return view(sizes());
  shape_t sz = sizes(), st = strides();
  sz.erase(sz.begin() + d);
  st.erase(st.begin() + d);
  tensor out = make_view(*this, std::move(sz), std::move(st), storage_offset());
  detail::record_view("squeeze", *this, out, [in = sizes()](const tensor& g) { return g.reshape(in); });
  return out;
}

tensor tensor::unsqueeze(std::int64_t d) const {
  d = wrap_dim(d, true);
  shape_t sz = sizes(), st = strides();
  const std::int64_t new_stride = static_cast<std::size_t>(d) < sz.size() ? sz[static_cast<std::size_t>(d)] * st[static_cast<std::size_t>(d)] : 1;
  sz.insert(sz.begin() + d, 1);
  st.insert(st.begin() + d, std::max<std::int64_t>(new_stride, 1));
  tensor out = make_view(*this, std::move(sz), std::move(st), storage_offset());
  detail::record_view("unsqueeze", *this, out, [in = sizes()](const tensor& g) { return g.reshape(in); });
  return out;
}

tensor tensor::flatten(std::int64_t start_dim, std::int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  start_dim = wrap_dim(start_dim);
  end_dim = wrap_dim(end_dim);
  if (start_dim > end_dim) throw error(errc::bad_argument, "flatten: start_dim " + std::to_string(start_dim) + " > end_dim " + std::to_string(end_dim));
  shape_t sz(sizes().begin(), sizes().begin() + start_dim);
  std::int64_t m = 1;
  for (std::int64_t i = start_dim; i <= end_dim; ++i) m *= size(i);
  sz.push_back(m);
  sz.insert(sz.end(), sizes().begin() + end_dim + 1, sizes().end());
  return reshape(std::move(sz));
}

tensor tensor::as_strided(shape_t sz, shape_t st, std::int64_t offset) const {
  if (sz.size() != st.size()) throw error(errc::bad_argument, "as_strided: sizes " + shape_to_string(sz) + " and strides " + shape_to_string(st) + " differ in length");
  std::int64_t max_index = offset;
  for (std::size_t i = 0; i < sz.size(); ++i) {
    if (sz[i] < 0 || st[i] < 0) throw error(errc::bad_argument, "as_strided: negative size or stride");
    if (sz[i] == 0) { max_index = offset - 1; break; }
    max_index += (sz[i] - 1) * st[i];
  }
  const auto capacity = static_cast<std::int64_t>(storage()->nbytes() / element_size());
  if (offset < 0 || max_index >= capacity)
    throw error(errc::index_out_of_range, "as_strided: view " + shape_to_string(sz) + " strides " + shape_to_string(st) +
                                              " offset " + std::to_string(offset) + " exceeds the storage of " + std::to_string(capacity) + " elements");
  if (should_record({this}))
    throw error(errc::not_supported, "as_strided is not differentiable; detach() the input first");
  return make_view(*this, std::move(sz), std::move(st), offset);
}

}  // namespace troupe
