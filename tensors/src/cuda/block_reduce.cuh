#pragma once
// Private: block-wide reductions (warp shuffles, then one shared slot per warp). Every thread
// of the block must call them; blockDim.x is a multiple of 32 and at most 1024.

#include "common.cuh"

namespace troupe::cuda_detail {

/// Reduces v over the block with the associative `op` (identity `id`); every thread gets the
/// result. `shared` holds at least 32 values.
template <class A, class Op>
__device__ inline A block_reduce(A v, Op op, A id, A* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = static_cast<int>(blockDim.x) >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  __syncthreads();  // shared may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? shared[lane] : id;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    if (lane == 0) shared[0] = v;
  }
  __syncthreads();
  return shared[0];
}

struct sum_op {
  template <class A> __device__ A operator()(A x, A y) const { return x + y; }
};
/// max / min that propagate NaN (as torch.max does).
struct max_op {
  template <class A> __device__ A operator()(A x, A y) const {
    if constexpr (std::is_floating_point_v<A>) { if (x != x || y != y) return x + y; }
    return x > y ? x : y;
  }
};
struct min_op {
  template <class A> __device__ A operator()(A x, A y) const {
    if constexpr (std::is_floating_point_v<A>) { if (x != x || y != y) return x + y; }
    return x < y ? x : y;
  }
};

}  // namespace troupe::cuda_detail
