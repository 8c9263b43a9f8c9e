#pragma once
// Private: the generic elementwise launchers. A functor F provides
//   __device__ void operator()(std::int64_t i) const             contiguous: element i of all
//   __device__ void operator()(const std::int64_t (&off)[N]) const strided: per-operand offsets
// and run_elementwise picks the contiguous grid-stride loop or the strided one.

#include "common.cuh"

namespace troupe::cuda_detail {

template <class F>
__global__ void contiguous_kernel(std::int64_t n, F f) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) f(i);
}

template <int N, class F>
__global__ void strided_kernel(strided<N> g, std::int64_t n, F f) {
  std::int64_t off[N];
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    offsets_of(g, i, off);
    f(off);
  }
}

/// Runs f over the elements of `ops` (ops[0] is the output; all have the shape of ops[0]) on
/// the current stream of their device.
template <int N, class F>
void run_elementwise(const std::array<const tensor*, N>& ops, const F& f, const char* what) {
  const tensor& out = *ops[0];
  const std::int64_t n = out.numel();
  if (n == 0) return;
  const int dev = device_of(out);
  device_guard guard(dev);
  const cudaStream_t s = stream_of(dev);
  bool contiguous = true;
  for (const tensor* t : ops) contiguous = contiguous && t->is_contiguous();
  if (contiguous) {
    contiguous_kernel<<<grid_for(n, dev), block_threads, 0, s>>>(n, f);
  } else {
    std::array<const shape_t*, N> st;
    for (int k = 0; k < N; ++k) st[k] = &ops[k]->strides();
    const strided<N> g = make_strided<N>(out.shape(), st, what);
    strided_kernel<N><<<grid_for(n, dev), block_threads, 0, s>>>(g, n, f);
  }
  TROUPE_CUDA_CHECK_LAUNCH();
}


}  // namespace troupe::cuda_detail
