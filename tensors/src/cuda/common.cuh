#pragma once
// Private: what every CUDA kernel file shares. That is the device element types and their
// conversions, the runtime dtype dispatch, and the strided geometry (up to 8 dims, offsets
// computed per element). It also holds launch sizing and the grid-stride loop. Included by .cu
// files only.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>

#include "check.cuh"
#include "troupe/tensors/tensor.hpp"

namespace troupe::cuda_detail {

// ---- element types ---------------------------------------------------------------------------

/// Tag carrying a device element type (visit_dtype's counterpart for device code).
template <class T> struct tag { using type = T; };

/// Calls f(tag<T>{}) with the device element type of `t`: float, double, __half, __nv_bfloat16,
/// int32_t, int64_t, uint8_t, bool.
template <class F>
decltype(auto) visit_device_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::float32: return f(tag<float>{});
    case dtype::float64: return f(tag<double>{});
    case dtype::float16: return f(tag<__half>{});
    case dtype::bfloat16: return f(tag<__nv_bfloat16>{});
    case dtype::int32: return f(tag<std::int32_t>{});
    case dtype::int64: return f(tag<std::int64_t>{});
    case dtype::uint8: return f(tag<std::uint8_t>{});
    case dtype::boolean: return f(tag<bool>{});
  }
  return f(tag<float>{});
}

/// Calls f(tag<U>{}) with the unsigned integer type of an element size (1, 2, 4 or 8 bytes).
/// It serves kernels that only move bits (copy, fill, where, gather): one instantiation serves
/// all dtypes.
template <class F> void visit_size(std::size_t n, F&& f) {
  switch (n) {
    case 1: f(tag<std::uint8_t>{}); return;
    case 2: f(tag<std::uint16_t>{}); return;
    case 4: f(tag<std::uint32_t>{}); return;
    default: f(tag<std::uint64_t>{}); return;
  }
}

template <class T> constexpr bool is_half_v = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

/// The type arithmetic is done in: float for 16-bit floats and float, double for double,
/// int64 for every integer type and bool.
template <class T> struct acc_type { using type = std::int64_t; };
template <> struct acc_type<float> { using type = float; };
template <> struct acc_type<double> { using type = double; };
template <> struct acc_type<__half> { using type = float; };
template <> struct acc_type<__nv_bfloat16> { using type = float; };
template <class T> using acc_t = typename acc_type<T>::type;

/// Element -> its accumulation type.
template <class T> __host__ __device__ inline acc_t<T> load_acc(T v) {
  if constexpr (std::is_same_v<T, __half>) return __half2float(v);
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(v);
  else return static_cast<acc_t<T>>(v);
}

/// Any arithmetic value -> element type T (16-bit floats via float, round to nearest even;
/// bool is value != 0), matching troupe::from_double on the host.
template <class T, class V> __host__ __device__ inline T store_as(V v) {
  if constexpr (std::is_same_v<V, __half> || std::is_same_v<V, __nv_bfloat16>) {
    return store_as<T>(load_acc(v));
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, bool>) {
    return v != V(0);
  } else {
    return static_cast<T>(v);
  }
}

// ---- geometry --------------------------------------------------------------------------------

inline constexpr int max_dims = 8;

/// Sizes shared by N operands and each operand's strides (elements), passed to kernels by value.
template <int N> struct strided {
  int ndim = 0;
  std::int64_t sizes[max_dims] = {};
  std::int64_t strides[N][max_dims] = {};
};

/// Offsets (elements) of the element with linear index i (row-major over sizes) in each operand.
template <int N>
__host__ __device__ inline void offsets_of(const strided<N>& g, std::int64_t i, std::int64_t (&off)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) off[k] = 0;
  for (int d = g.ndim - 1; d >= 0; --d) {
    const std::int64_t s = g.sizes[d];
    const std::int64_t c = i % s;
    i /= s;
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] += c * g.strides[k][d];
  }
}

/// Builds the geometry of `ops` (all of shape `sizes`, strides from each tensor), dropping
/// size-1 dims and merging dims that are contiguous in every operand. Throws not_supported
/// naming `what` when more than 8 dims remain.
template <int N>
strided<N> make_strided(const shape_t& sizes, const std::array<const shape_t*, N>& strides, const char* what) {
  strided<N> g;
  int nd = 0;
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    if (nd > 0) {
      bool mergeable = true;
      for (int k = 0; k < N; ++k)
        mergeable = mergeable && (*strides[k])[d] * sizes[d] == g.strides[k][nd - 1];
      if (mergeable) {
        g.sizes[nd - 1] *= sizes[d];
        for (int k = 0; k < N; ++k) g.strides[k][nd - 1] = (*strides[k])[d];
        continue;
      }
    }
    if (nd == max_dims)
      throw error(errc::not_supported, std::string(what) + ": CUDA kernels support at most 8 non-mergeable dims, got shape " +
                                           shape_to_string(sizes));
    g.sizes[nd] = sizes[d];
    for (int k = 0; k < N; ++k) g.strides[k][nd] = (*strides[k])[d];
    ++nd;
  }
  g.ndim = nd;
  return g;
}

/// Geometry without merging (kernels that need the coordinate of one dim). Throws not_supported.
template <int N>
strided<N> make_strided_exact(const shape_t& sizes, const std::array<const shape_t*, N>& strides, const char* what) {
  if (sizes.size() > static_cast<std::size_t>(max_dims))
    throw error(errc::not_supported, std::string(what) + ": CUDA kernels support at most 8 dims, got shape " +
                                         shape_to_string(sizes));
  strided<N> g;
  g.ndim = static_cast<int>(sizes.size());
  for (int d = 0; d < g.ndim; ++d) {
    g.sizes[d] = sizes[static_cast<std::size_t>(d)];
    for (int k = 0; k < N; ++k) g.strides[k][d] = (*strides[k])[static_cast<std::size_t>(d)];
  }
  return g;
}

/// True when every tensor is contiguous (a plain linear index addresses all of them).
inline bool all_contiguous(std::initializer_list<const tensor*> ts) {
  for (const tensor* t : ts)
    if (!t->is_contiguous()) return false;
  return true;
}

// ---- launching -------------------------------------------------------------------------------

inline constexpr int block_threads = 256;

/// Grid size for a grid-stride loop over n items on `device` (a few waves of blocks at most).
int grid_for(std::int64_t n, int device, int threads = block_threads);

/// Grid-stride loop index helpers.
__device__ inline std::int64_t global_index() {
  return static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::int64_t grid_stride() { return static_cast<std::int64_t>(gridDim.x) * blockDim.x; }

/// Typed pointer to a tensor's first element (device element type).
template <class T> T* ptr(const tensor& t) { return static_cast<T*>(t.data_ptr()); }

/// Device ordinal of a CUDA tensor.
inline int device_of(const tensor& t) { return t.device().index; }

/// A fresh contiguous tensor on the same device as `like` (used for scratch buffers).
tensor scratch(const shape_t& shape, dtype t, const tensor& like);

}  // namespace troupe::cuda_detail
