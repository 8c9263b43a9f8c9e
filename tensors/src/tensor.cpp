// Tensor metadata, views and copies. Views record autograd like any op (Note [Op recording]).
#include "troupe/tensors/tensor.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <sstream>

#include "kernels.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/reduction.hpp"

namespace troupe {

namespace detail {
void no_cuda(const char* what) {
  throw error(errc::device_mismatch, std::string(what) + ": CUDA tensor, but Troupe was built without CUDA");
}
}  // namespace detail

std::string shape_to_string(const shape_t& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

shape_t contiguous_strides(const shape_t& sizes) {
  shape_t st(sizes.size());
  std::int64_t acc = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    st[i] = acc;
    // Saturates: only a shape with a zero extent (no elements) can overflow here, and its
    // strides are never used to address memory.
    if (__builtin_mul_overflow(acc, std::max<std::int64_t>(sizes[i], 1), &acc)) acc = std::numeric_limits<std::int64_t>::max();
  }
  return st;
}

std::int64_t numel_of(const shape_t& sizes) {
  // The product of the non-zero sizes must fit too: contiguous strides are built from it.
  std::int64_t n = 1;
  bool bad = false, zero = false;
  for (auto s : sizes) {
    bad |= s < 0 || __builtin_mul_overflow(n, s > 1 ? s : 1, &n);
    zero |= s == 0;
  }
  if (bad) throw error(errc::bad_argument, "shape " + shape_to_string(sizes) + " has a negative size or more than 2^63 elements");
  return zero ? 0 : n;
}

std::int64_t nbytes_of(const shape_t& sizes, dtype dt) {
  std::int64_t bytes = 0;
  if (__builtin_mul_overflow(numel_of(sizes), static_cast<std::int64_t>(element_size(dt)), &bytes))
    throw error(errc::bad_argument, "shape " + shape_to_string(sizes) + " of " + std::string(to_string(dt)) + " has more than 2^63 bytes");
  return bytes;
}

shape_t broadcast_shapes(const shape_t& a, const shape_t& b, const char* op) {
  const std::size_t n = std::max(a.size(), b.size());
  shape_t out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw error(errc::shape_mismatch, std::string(op) + ": shapes " + shape_to_string(a) + " and " +
                                            shape_to_string(b) + " do not broadcast (dim " +
                                            std::to_string(i) + ": " + std::to_string(da) + " vs " +
                                            std::to_string(db) + ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

tensor make_view(const tensor& src, shape_t sizes, shape_t strides, std::int64_t offset) {
  auto impl = std::make_shared<tensor_impl>();
  const auto& s = *src.impl();
  impl->storage = s.storage;
  impl->sizes = std::move(sizes);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = s.dtype;
  impl->base = s.base ? s.base : src.impl();
  return tensor(std::move(impl));
}

// ---- metadata ---------------------------------------------------------------------------

tensor_impl& tensor::checked() const {
  if (!impl_) throw error(errc::invalid_state, "operation on an undefined tensor");
  return *impl_;
}

std::int64_t tensor::wrap_dim(std::int64_t d, bool inclusive) const {
  const std::int64_t n = dim() + (inclusive ? 1 : 0);
  const std::int64_t lo = n == 0 ? -1 : -n, hi = n == 0 ? 0 : n - 1;
  if (d < lo || d > hi)
    throw error(errc::index_out_of_range, "dimension " + std::to_string(d) + " out of range for a " +
                                              std::to_string(dim()) + "-d tensor of shape " +
                                              shape_to_string(shape()));
  return d < 0 ? d + std::max<std::int64_t>(n, 1) : d;
}

std::int64_t tensor::size(std::int64_t d) const { return sizes()[static_cast<std::size_t>(wrap_dim(d))]; }
std::int64_t tensor::stride(std::int64_t d) const { return strides()[static_cast<std::size_t>(wrap_dim(d))]; }
std::int64_t tensor::numel() const { return numel_of(checked().sizes); }
troupe::device tensor::device() const { return checked().storage->dev(); }

bool tensor::is_contiguous() const {
  const auto& im = checked();
  std::int64_t expected = 1;
  for (std::size_t i = im.sizes.size(); i-- > 0;) {
    if (im.sizes[i] == 1) continue;
    if (im.sizes[i] == 0) return true;
    if (im.strides[i] != expected) return false;
    expected *= im.sizes[i];
  }
  return true;
}

void* tensor::data_ptr() const {
  const auto& im = checked();
  return static_cast<char*>(im.storage->data()) + im.offset * static_cast<std::int64_t>(troupe::element_size(im.dtype));
}

bool tensor::requires_grad() const {
  const auto& m = checked().autograd_meta;
  return m && m->requires_grad();
}

tensor tensor::detach() const {
  const auto& s = checked();
  auto impl = std::make_shared<tensor_impl>();
  impl->storage = s.storage;
  impl->sizes = s.sizes;
  impl->strides = s.strides;
  impl->offset = s.offset;
  impl->dtype = s.dtype;
  // Not a view in the autograd sense (as PyTorch's detach()): it shares storage and the
  // version counter, but has no history and no base.
  return tensor(std::move(impl));
}

// ---- views ------------------------------------------------------------------------------

namespace {

// Records a view op whose backward maps the output gradient back to the input's shape.
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
  record_view("view", *this, out, [in = sizes()](const tensor& g) { return g.reshape(in); });
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
  record_view("transpose", *this, out, [d0, d1](const tensor& g) { return g.transpose(d0, d1); });
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
  record_view("permute", *this, out, [inverse](const tensor& g) { return g.permute(inverse); });
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
  record_view("slice", *this, out, [in = sizes(), d, start, end, step](const tensor& g) {
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
  record_view("select", *this, out, [in = sizes(), d, index](const tensor& g) {
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
  record_view("expand", *this, out, [in = sizes()](const tensor& g) { return sum_to(g, in); });
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
  record_view("squeeze", *this, out, [in = sizes()](const tensor& g) { return g.reshape(in); });
  return out;
}

tensor tensor::unsqueeze(std::int64_t d) const {
  d = wrap_dim(d, true);
  shape_t sz = sizes(), st = strides();
  const std::int64_t new_stride = static_cast<std::size_t>(d) < sz.size() ? sz[static_cast<std::size_t>(d)] * st[static_cast<std::size_t>(d)] : 1;
  sz.insert(sz.begin() + d, 1);
  st.insert(st.begin() + d, std::max<std::int64_t>(new_stride, 1));
  tensor out = make_view(*this, std::move(sz), std::move(st), storage_offset());
  record_view("unsqueeze", *this, out, [in = sizes()](const tensor& g) { return g.reshape(in); });
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

// ---- copies -----------------------------------------------------------------------------

tensor tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

tensor tensor::clone() const {
  tensor out = empty(shape(), tensor_options(dtype(), device()));
  {
    no_grad_guard g;
    TROUPE_DISPATCH(device(), copy, out, *this);
  }
  record_view("clone", *this, out, [](const tensor& g) { return g; });
  return out;
}

tensor tensor::to(troupe::dtype t) const {
  if (t == dtype()) return *this;
  tensor out = empty(shape(), tensor_options(t, device()));
  TROUPE_DISPATCH(device(), copy, out, *this);
  if (is_floating(t)) {
    record_view("to", *this, out, [from = dtype()](const tensor& g) { return g.to(from); });
  }
  return out;
}

tensor tensor::to(troupe::device d) const {
  if (d == device()) return *this;
#if defined(TROUPE_WITH_CUDA)
  tensor src = contiguous();
  tensor out = empty(shape(), tensor_options(dtype(), d));
  kernels::cuda::copy_between_devices(out, src);
  record_view("to_device", *this, out, [from = device()](const tensor& g) { return g.to(from); });
  return out;
#else
  detail::no_cuda("to(device)");
#endif
}

tensor& tensor::copy_(const tensor& src) {
  if (!src.defined()) throw error(errc::invalid_state, "copy_: source tensor is undefined");
  const shape_t b = broadcast_shapes(shape(), src.shape(), "copy_");
  if (b != shape())
    throw error(errc::shape_mismatch, "copy_: source of shape " + shape_to_string(src.shape()) +
                                          " does not broadcast to destination shape " + shape_to_string(shape()));
  check_in_place(*this, {&src}, "copy_");
  const bool rec = should_record({this, &src});
  tensor s = src.expand(shape()).detach();
  if (s.device() != device()) {
#if defined(TROUPE_WITH_CUDA)
    tensor staged = s.contiguous().to(device());
    TROUPE_DISPATCH(device(), copy, *this, staged);
#else
    detail::no_cuda("copy_");
#endif
  } else if (s.storage() == storage()) {
    tensor tmp = s.clone();  // overlapping source: copy through a temporary
    TROUPE_DISPATCH(device(), copy, *this, tmp);
  } else {
    TROUPE_DISPATCH(device(), copy, *this, s);
  }
  bump_version();
  if (rec) {
    op_record r;
    r.name = "copy_";
    r.inputs = {*this, src};
    r.outputs = {*this};
    r.in_place = true;
    r.backward = [src_shape = src.shape(), src_dtype = src.dtype()](const backward_ctx& ctx) -> tensor_list {
      const tensor& g = ctx.grad_outputs[0];
      if (!g.defined()) return {tensor(), tensor()};
      return {tensor(), sum_to(g, src_shape).to(src_dtype)};
    };
    record_op(std::move(r));
  }
  return *this;
}

}  // namespace troupe
