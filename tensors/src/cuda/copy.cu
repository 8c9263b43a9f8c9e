// Strided copy with dtype conversion and fill (kernels::cuda::copy / fill). Transfers between
// devices are in transfer.cpp.
#include <cstring>

#include "../kernels.hpp"
#include "elementwise.cuh"

namespace troupe::kernels::cuda {

using namespace troupe::cuda_detail;

namespace {

// Converts one S element into the dtype `to` (runtime switch: uniform across the grid, and it
// keeps the instantiations at one per source dtype instead of one per pair).
template <class S> __device__ inline void convert_store(void* dst, std::int64_t off, dtype to, S v) {
  switch (to) {
    case dtype::float32: static_cast<float*>(dst)[off] = store_as<float>(v); return;
    case dtype::float64: static_cast<double*>(dst)[off] = store_as<double>(v); return;
    case dtype::float16: static_cast<__half*>(dst)[off] = store_as<__half>(v); return;
    case dtype::bfloat16: static_cast<__nv_bfloat16*>(dst)[off] = store_as<__nv_bfloat16>(v); return;
    case dtype::int32: static_cast<std::int32_t*>(dst)[off] = store_as<std::int32_t>(v); return;
    case dtype::int64: static_cast<std::int64_t*>(dst)[off] = store_as<std::int64_t>(v); return;
    case dtype::uint8: static_cast<std::uint8_t*>(dst)[off] = store_as<std::uint8_t>(v); return;
    case dtype::boolean: static_cast<bool*>(dst)[off] = store_as<bool>(v); return;
  }
}

template <class S> struct convert_fn {
  void* out;
  dtype to;
  const S* in;
  __device__ void operator()(std::int64_t i) const { convert_store(out, i, to, in[i]); }
  __device__ void operator()(const std::int64_t (&o)[2]) const { convert_store(out, o[0], to, in[o[1]]); }
};

// Same dtype: a bit copy, one instantiation per element size.
template <class U> struct move_fn {
  U* out;
  const U* in;
  __device__ void operator()(std::int64_t i) const { out[i] = in[i]; }
  __device__ void operator()(const std::int64_t (&o)[2]) const { out[o[0]] = in[o[1]]; }
};

template <class U> struct fill_fn {
  U* out;
  U value;
  __device__ void operator()(std::int64_t i) const { out[i] = value; }
  __device__ void operator()(const std::int64_t (&o)[1]) const { out[o[0]] = value; }
};

// The bit pattern of `value` converted to dtype t with the host rules (troupe::from_double).
std::uint64_t host_bits(dtype t, double value) {
  std::uint64_t bits = 0;
  visit_dtype(t, [&](auto tag_value) {
    using T = decltype(tag_value);
    const T v = from_double<T>(value);
    std::memcpy(&bits, &v, sizeof(T));
  });
  return bits;
}

}  // namespace

void copy(const tensor& dst, const tensor& src) {
  if (dst.numel() == 0) return;
  const int dev = device_of(dst);
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    device_guard g(dev);
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream_of(dev)));
    return;
  }
  if (dst.dtype() == src.dtype()) {
    visit_size(dst.element_size(), [&](auto t) {
      using U = typename decltype(t)::type;
      run_elementwise<2>({&dst, &src}, move_fn<U>{ptr<U>(dst), ptr<U>(src)}, "copy");
    });
    return;
  }
  visit_device_dtype(src.dtype(), [&](auto t) {
    using S = typename decltype(t)::type;
    run_elementwise<2>({&dst, &src}, convert_fn<S>{dst.data_ptr(), dst.dtype(), ptr<S>(src)}, "copy");
  });
}

void fill(const tensor& out, double value) {
  const std::int64_t n = out.numel();
  if (n == 0) return;
  const std::uint64_t bits = host_bits(out.dtype(), value);
  if (bits == 0 && out.is_contiguous()) {
    const int dev = device_of(out);
    device_guard g(dev);
    TROUPE_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), stream_of(dev)));
    return;
  }
  visit_size(out.element_size(), [&](auto t) {
    using U = typename decltype(t)::type;
    run_elementwise<1>({&out}, fill_fn<U>{ptr<U>(out), static_cast<U>(bits)}, "fill");
  });
}

}  // namespace troupe::kernels::cuda
