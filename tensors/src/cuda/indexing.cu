// index_select, gather, scatter_add, index_add. All four walk an iteration shape with three
// offsets. X is the directly addressed operand. Y is the indexed operand, its stride along
// `dim` zeroed. I is the int64 index. Y's element is Y + index[I] * stride_y(dim).
//   index_select: iter = out,   X = out, Y = a,   I = index along dim only
//   gather:       iter = index, X = out, Y = a,   I = index
//   scatter_add:  iter = index, X = src, Y = out, I = index   (atomicAdd into Y)
//   index_add:    iter = src,   X = src, Y = out, I = index along dim only (atomicAdd into Y)
// Atomic adds run on float/double/int32/int64 targets; float16/bfloat16 accumulate in a float32
// scratch copy and uint8/bool in an int32 one (one rounding at the end, no atomicCAS loops).
#include "../kernels.hpp"
#include "common.cuh"

namespace troupe::kernels::cuda {

using namespace troupe::cuda_detail;

namespace {

struct index_geometry {
  strided<3> g;
  std::int64_t n = 0;
  std::int64_t y_dim_stride = 0;
};

// `full_index`: the index has the iteration shape (gather/scatter); else it is 1-d along dim.
index_geometry geometry_of(const tensor& iter, const tensor& x, const tensor& y, const tensor& index, std::int64_t dim,
                           bool full_index, const char* what) {
  const auto d = static_cast<std::size_t>(dim);
  const bool has_dim = d < y.strides().size();  // false for 0-d operands: a plain element copy
  shape_t y_strides = y.strides();
  shape_t i_strides(iter.shape().size(), 0);
  if (full_index) i_strides = index.strides();
  else if (has_dim) i_strides[d] = index.dim() == 0 ? 0 : index.strides()[0];
  if (has_dim) y_strides[d] = 0;
  index_geometry ig;
  ig.g = make_strided<3>(iter.shape(), {&x.strides(), &y_strides, &i_strides}, what);
  ig.n = iter.numel();
  ig.y_dim_stride = has_dim ? y.strides()[d] : 0;
  return ig;
}

template <class U>
__global__ void gather_kernel(U* x, const U* y, const std::int64_t* index, index_geometry ig) {
  std::int64_t off[3];
  for (std::int64_t i = global_index(); i < ig.n; i += grid_stride()) {
    offsets_of(ig.g, i, off);
    x[off[0]] = y[off[1] + index[off[2]] * ig.y_dim_stride];
  }
}

__device__ inline void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ inline void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ inline void atomic_add(std::int32_t* p, std::int32_t v) { atomicAdd(reinterpret_cast<int*>(p), static_cast<int>(v)); }
__device__ inline void atomic_add(std::int64_t* p, std::int64_t v) {
  // Two's complement: adding the unsigned bit pattern is adding the signed value.
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
}

template <class Y, class X>
__global__ void scatter_kernel(Y* y, const X* x, const std::int64_t* index, index_geometry ig) {
  std::int64_t off[3];
  for (std::int64_t i = global_index(); i < ig.n; i += grid_stride()) {
    offsets_of(ig.g, i, off);
    atomic_add(y + off[1] + index[off[2]] * ig.y_dim_stride, store_as<Y>(x[off[0]]));
  }
}

void run_gather(const tensor& out, const tensor& a, const tensor& index, const index_geometry& ig) {
  if (ig.n == 0) return;
  const int dev = device_of(out);
  device_guard guard(dev);
  visit_size(out.element_size(), [&](auto t) {
    using U = typename decltype(t)::type;
    gather_kernel<U><<<grid_for(ig.n, dev), block_threads, 0, stream_of(dev)>>>(ptr<U>(out), ptr<U>(a), ptr<std::int64_t>(index), ig);
    TROUPE_CUDA_CHECK_LAUNCH();
  });
}

template <class Y, class X> void launch_scatter(const tensor& target, const tensor& src, const tensor& index, const index_geometry& ig) {
  const int dev = device_of(target);
  device_guard guard(dev);
  scatter_kernel<Y, X><<<grid_for(ig.n, dev), block_threads, 0, stream_of(dev)>>>(ptr<Y>(target), ptr<X>(src), ptr<std::int64_t>(index), ig);
  TROUPE_CUDA_CHECK_LAUNCH();
}

// Adds src into `target` (an atomic-capable dtype) at the positions ig describes.
void scatter_into(const tensor& target, const tensor& src, const tensor& index, const index_geometry& ig) {
  switch (src.dtype()) {
    case dtype::float32: return launch_scatter<float, float>(target, src, index, ig);
    case dtype::float64: return launch_scatter<double, double>(target, src, index, ig);
    case dtype::float16: return launch_scatter<float, __half>(target, src, index, ig);
    case dtype::bfloat16: return launch_scatter<float, __nv_bfloat16>(target, src, index, ig);
    case dtype::int32: return launch_scatter<std::int32_t, std::int32_t>(target, src, index, ig);
    case dtype::int64: return launch_scatter<std::int64_t, std::int64_t>(target, src, index, ig);
    case dtype::uint8: return launch_scatter<std::int32_t, std::uint8_t>(target, src, index, ig);
    case dtype::boolean: return launch_scatter<std::int32_t, bool>(target, src, index, ig);
  }
}

dtype atomic_dtype(dtype t) {
  switch (t) {
    case dtype::float16: case dtype::bfloat16: return dtype::float32;
    case dtype::uint8: case dtype::boolean: return dtype::int32;
    default: return t;
  }
}

// scatter_add / index_add: out += src at the indexed positions, through a scratch copy of out
// when its dtype has no atomicAdd.
void run_scatter(const tensor& out, std::int64_t dim, const tensor& index, const tensor& src, bool full_index, const char* what) {
  if (src.numel() == 0 || out.numel() == 0) return;
  const dtype at = atomic_dtype(out.dtype());
  if (at == out.dtype()) {
    scatter_into(out, src, index, geometry_of(full_index ? index : src, src, out, index, dim, full_index, what));
    return;
  }
  tensor acc = scratch(out.shape(), at, out);
  copy(acc, out);
  scatter_into(acc, src, index, geometry_of(full_index ? index : src, src, acc, index, dim, full_index, what));
  copy(out, acc);
}

}  // namespace

void index_select(const tensor& out, const tensor& a, std::int64_t dim, const tensor& index) {
  if (out.numel() == 0) return;
  run_gather(out, a, index, geometry_of(out, out, a, index, dim, false, "index_select"));
}

void gather(const tensor& out, const tensor& a, std::int64_t dim, const tensor& index) {
  if (out.numel() == 0) return;
  run_gather(out, a, index, geometry_of(index, out, a, index, dim, true, "gather"));
}

void scatter_add(const tensor& out, std::int64_t dim, const tensor& index, const tensor& src) {
  run_scatter(out, dim, index, src, true, "scatter_add");
}

void index_add(const tensor& out, std::int64_t dim, const tensor& index, const tensor& src) {
  run_scatter(out, dim, index, src, false, "index_add");
}

}  // namespace troupe::kernels::cuda
