#pragma once
/// \file tensor.hpp
/// The tensor: a strided view (shape, strides, offset, dtype) of a reference-counted storage.
/// Copying a `tensor` copies the handle (both refer to the same tensor, as in PyTorch); views
/// share storage; `clone()` copies the data. Synchronous calls validate eagerly and throw
/// troupe::error naming the op and the operands' shapes, dtypes and devices.

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "troupe/tensors/device.hpp"
#include "troupe/tensors/dtype.hpp"
#include "troupe/tensors/error.hpp"
#include "troupe/tensors/shape.hpp"
#include "troupe/tensors/storage.hpp"

namespace troupe {

class tensor;
using tensor_list = std::vector<tensor>;
class autograd_meta_interface;

/// The shared state behind a tensor handle. Public so that layers above (autograd, the runtime)
/// can reach storage and metadata; user code goes through `tensor`.
struct tensor_impl {
  std::shared_ptr<troupe::storage> storage;
  shape_t sizes;
  shape_t strides;
  std::int64_t offset = 0;  ///< in elements
  troupe::dtype dtype = troupe::dtype::float32;
  /// For a view: the tensor it views (itself not a view), else null.
  std::shared_ptr<tensor_impl> base;
  /// Autograd metadata; created and interpreted by the autograd layer only.
  std::shared_ptr<autograd_meta_interface> autograd_meta;
};

class tensor {
 public:
  /// An undefined tensor (no storage); most calls on it throw invalid_state.
  tensor() = default;
  explicit tensor(std::shared_ptr<tensor_impl> impl) : impl_(std::move(impl)) {}

  // ---- metadata ------------------------------------------------------------------------
  bool defined() const noexcept { return impl_ != nullptr; }
  const shape_t& shape() const { return checked().sizes; }
  const shape_t& sizes() const { return checked().sizes; }
  /// Size of one dimension; negative dims count from the end. Throws index_out_of_range.
  std::int64_t size(std::int64_t dim) const;
  const shape_t& strides() const { return checked().strides; }
  std::int64_t stride(std::int64_t dim) const;
  std::int64_t dim() const { return static_cast<std::int64_t>(checked().sizes.size()); }
  std::int64_t numel() const;
  std::int64_t storage_offset() const { return checked().offset; }
  troupe::dtype dtype() const { return checked().dtype; }
  troupe::device device() const;
  std::size_t element_size() const { return troupe::element_size(dtype()); }
  /// numel() * element_size()
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * element_size(); }
  bool is_contiguous() const;
  bool is_cpu() const { return device().is_cpu(); }
  bool is_cuda() const { return device().is_cuda(); }
  /// Normalises a possibly negative dim against dim() (+1 when `inclusive`, for unsqueeze).
  std::int64_t wrap_dim(std::int64_t d, bool inclusive = false) const;

  /// Pointer to the first element (storage base + offset).
  void* data_ptr() const;
  /// Typed pointer to the first element; throws dtype_mismatch if T is not the dtype's type.
  template <class T> T* data() const {
    if (dtype_of<T>() != dtype())
      throw error(errc::dtype_mismatch, std::string("data<") + std::string(troupe::to_string(dtype_of<T>())) +
                                            ">() on a " + std::string(troupe::to_string(dtype())) + " tensor");
    return static_cast<T*>(data_ptr());
  }
  const std::shared_ptr<troupe::storage>& storage() const { return checked().storage; }
  /// The version counter of the storage (bumped by in-place writes through any view).
  std::uint64_t version() const { return storage()->version(); }
  /// Bumps the version counter (kernels writing in place call this).
  void bump_version() const { storage()->bump_version(); }
  const std::shared_ptr<tensor_impl>& impl() const { return impl_; }
  /// True if both handles refer to the same tensor.
  bool is_same(const tensor& o) const noexcept { return impl_ == o.impl_; }

  // ---- autograd (the autograd layer gives the full API; these read its metadata) ----------
  /// True if autograd metadata exists and says this tensor requires grad.
  bool requires_grad() const;
  autograd_meta_interface* autograd_meta() const { return checked().autograd_meta.get(); }
  void set_autograd_meta(std::shared_ptr<autograd_meta_interface> m) const { checked().autograd_meta = std::move(m); }
  /// A new tensor sharing storage (and version counter) with no autograd history.
  tensor detach() const;

  // ---- views (share storage; record autograd like any op) ---------------------------------
  /// View with a new shape (one dim may be -1); throws invalid_view if strides do not allow it.
  tensor view(shape_t shape) const;
  /// view() when possible, else a contiguous copy.
  tensor reshape(shape_t shape) const;
  tensor transpose(std::int64_t d0, std::int64_t d1) const;
  /// transpose(0, 1) of a 2-d tensor.
  tensor t() const;
  tensor permute(shape_t dims) const;
  tensor narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const;
  /// Elements start, start+step, ... < end along dim (end clamped; step > 0).
  tensor slice(std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step = 1) const;
  /// Removes dim, taking index `index` of it.
  tensor select(std::int64_t dim, std::int64_t index) const;
  /// Broadcasts size-1 dims (and new leading dims) to `shape`; -1 keeps a size.
  tensor expand(shape_t shape) const;
  tensor squeeze() const;
  tensor squeeze(std::int64_t dim) const;
  tensor unsqueeze(std::int64_t dim) const;
  tensor flatten(std::int64_t start_dim = 0, std::int64_t end_dim = -1) const;
  /// Arbitrary strided view of the same storage (bounds are checked against the storage).
  tensor as_strided(shape_t sizes, shape_t strides, std::int64_t offset) const;
  /// This tensor if contiguous, else a contiguous copy.
  tensor contiguous() const;
  bool is_view() const { return checked().base != nullptr; }
  /// The tensor this one views (undefined if not a view).
  tensor base() const { return tensor(checked().base); }

  // ---- conversions and copies -----------------------------------------------------------
  tensor to(troupe::dtype t) const;
  /// Copy to another device (asynchronous on the current CUDA stream, pinned host staging).
  tensor to(troupe::device d) const;
  tensor cpu() const { return to(cpu_device); }
  tensor clone() const;
  /// The single element as double; throws bad_argument if numel() != 1.
  double item() const;
  template <class T> T item() const { return from_double<T>(item()); }

  // ---- in-place (bump the version counter) ------------------------------------------------
  tensor& zero_();
  tensor& fill_(double value);
  /// Copies src into this tensor (broadcasting src, converting dtype, across devices).
  tensor& copy_(const tensor& src);
  tensor& add_(const tensor& other, double alpha = 1.0);
  tensor& add_(double value);
  tensor& sub_(const tensor& other);
  tensor& mul_(const tensor& other);
  tensor& mul_(double value);
  tensor& div_(const tensor& other);
  tensor& div_(double value);

  // ---- method forms of the ops (see elementwise.hpp, reduction.hpp, linalg.hpp) -----------
  tensor add(const tensor& o) const;
  tensor sub(const tensor& o) const;
  tensor mul(const tensor& o) const;
  tensor div(const tensor& o) const;
  tensor pow(double exponent) const;
  tensor neg() const;
  tensor abs() const;
  tensor exp() const;
  tensor log() const;
  tensor sqrt() const;
  tensor rsqrt() const;
  tensor relu() const;
  tensor sigmoid() const;
  tensor tanh() const;
  tensor matmul(const tensor& o) const;
  /// Sum of all elements (0-d result).
  tensor sum() const;
  tensor sum(shape_t dims, bool keepdim = false) const;
  tensor mean() const;
  tensor mean(shape_t dims, bool keepdim = false) const;

  /// Readable printing: dtype, device, shape and the values (abbreviated for large tensors).
  std::string to_string() const;

 private:
  tensor_impl& checked() const;
  std::shared_ptr<tensor_impl> impl_;
};

// Operators: arithmetic with broadcasting; a scalar operand keeps the tensor's dtype.
tensor operator+(const tensor& a, const tensor& b);
tensor operator-(const tensor& a, const tensor& b);
tensor operator*(const tensor& a, const tensor& b);
tensor operator/(const tensor& a, const tensor& b);
tensor operator+(const tensor& a, double b);
tensor operator-(const tensor& a, double b);
tensor operator*(const tensor& a, double b);
tensor operator/(const tensor& a, double b);
tensor operator+(double a, const tensor& b);
tensor operator-(double a, const tensor& b);
tensor operator*(double a, const tensor& b);
tensor operator/(double a, const tensor& b);
tensor operator-(const tensor& a);

/// Wraps an existing tensor impl into a fresh tensor with the given geometry over the same
/// storage (no autograd recording). Used by view ops and by kernels.
tensor make_view(const tensor& src, shape_t sizes, shape_t strides, std::int64_t offset);

}  // namespace troupe
