// The tensor handle: its metadata, raw data access and detach().
// The other methods live by concept: views in tensor_views.cpp, conversions and copies in
// tensor_conversions.cpp, in-place ops in ops/inplace.cpp, method forms of the ops in
// tensor_methods.cpp, printing in ops/print.cpp.
#include "troupe/tensors/tensor.hpp"

#include <algorithm>

#include "troupe/tensors/autograd_hook.hpp"

namespace troupe {

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

}  // namespace troupe
