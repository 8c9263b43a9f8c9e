// CPU kernels: index_select, gather, scatter_add, index_add.
// Slice-wise ops (index_select, index_add) reuse the copy/binary kernels on strided views of
// one slice, so they inherit their fast paths. Element-wise ops (gather, scatter_add) walk the
// index tensor with an N-d counter. Indices are int64 and already range-checked by the op layer.
#include "../kernels.hpp"
#include "loops.hpp"

namespace troupe::kernels::cpu {

namespace {
using namespace detail;

// The slice `i` of `t` along `dim`, as a view without autograd.
tensor slice_of(const tensor& t, std::int64_t dim, std::int64_t i) {
  shape_t sz = t.sizes(), st = t.strides();
  const std::int64_t off = t.storage_offset() + i * st[static_cast<std::size_t>(dim)];
  sz.erase(sz.begin() + dim);
  st.erase(st.begin() + dim);
  return make_view(t, std::move(sz), std::move(st), off);
}

const std::int64_t* index_data(const tensor& index) { return static_cast<const std::int64_t*>(index.data_ptr()); }
}  // namespace

void index_select(const tensor& out, const tensor& a, std::int64_t dim, const tensor& index) {
  const std::int64_t n = index.numel();
  const std::int64_t* idx = index_data(index);
  const std::int64_t is = index.dim() == 0 ? 0 : index.stride(0);
  for (std::int64_t i = 0; i < n; ++i) copy(slice_of(out, dim, i), slice_of(a, dim, idx[i * is]));
}

void index_add(const tensor& out, std::int64_t dim, const tensor& index, const tensor& src) {
  const std::int64_t n = index.numel();
  const std::int64_t* idx = index_data(index);
  const std::int64_t is = index.dim() == 0 ? 0 : index.stride(0);
  for (std::int64_t i = 0; i < n; ++i) {
    const tensor o = slice_of(out, dim, idx[i * is]);
    binary(binary_op::add, o, o, slice_of(src, dim, i), 1.0);
  }
}

void gather(const tensor& out, const tensor& a, std::int64_t dim, const tensor& index) {
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* pa = static_cast<const T*>(a.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const std::int64_t* pi = index_data(index);
    const auto d = static_cast<std::size_t>(dim);
    for_each_index(index.sizes(), [&](const shape_t& at) {
      const std::int64_t j = pi[offset_of(at, index.strides())];
      const std::int64_t src_off = offset_of(at, a.strides()) + (j - at[d]) * a.strides()[d];
      po[offset_of(at, out.strides())] = pa[src_off];
    });
  });
}

void scatter_add(const tensor& out, std::int64_t dim, const tensor& index, const tensor& src) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T* ps = static_cast<const T*>(src.data_ptr());
    T* po = static_cast<T*>(out.data_ptr());
    const std::int64_t* pi = index_data(index);
    const auto d = static_cast<std::size_t>(dim);
    for_each_index(index.sizes(), [&](const shape_t& at) {
      const std::int64_t j = pi[offset_of(at, index.strides())];
      T* o = po + offset_of(at, out.strides()) + (j - at[d]) * out.strides()[d];
      store(o, load(o) + load(ps + offset_of(at, src.strides())));
    });
  });
}

}  // namespace troupe::kernels::cpu
