// Reductions over a set of dims (sum, mean, max, min), arg_reduce and var. One block per output
// element computes it; a short reduction takes one thread instead. The reduced elements are
// addressed through an `inner` geometry, the output through an `outer` one. Both use a's strides.
#include <cstdint>
#include <limits>

#include "../kernels.hpp"
#include "block_reduce.cuh"

namespace troupe::kernels::cuda {

using namespace troupe::cuda_detail;

namespace {

constexpr int reduce_threads = 256;

// outer: out.shape with strides {out, a}; inner: a's reduced dims with a's strides.
struct reduce_geometry {
  strided<2> outer;
  strided<1> inner;
  std::int64_t n_out = 0, n_in = 0;
};

reduce_geometry geometry_of(const tensor& out, const tensor& a, const shape_t& dims, const char* what) {
  reduce_geometry g;
  shape_t inner_sizes(a.shape().size(), 1);
  for (auto d : dims)
    if (d >= 0 && static_cast<std::size_t>(d) < inner_sizes.size()) inner_sizes[static_cast<std::size_t>(d)] = a.shape()[static_cast<std::size_t>(d)];
  g.outer = make_strided<2>(out.shape(), {&out.strides(), &a.strides()}, what);
  g.inner = make_strided<1>(inner_sizes, {&a.strides()}, what);
  g.n_out = out.numel();
  g.n_in = numel_of(inner_sizes);
  return g;
}

__device__ inline std::int64_t inner_offset(const strided<1>& g, std::int64_t j) {
  std::int64_t off[1];
  offsets_of(g, j, off);
  return off[0];
}

template <class A> __device__ inline A identity_of(reduce_op op) {
  if (op == reduce_op::max) return std::numeric_limits<A>::has_infinity ? -std::numeric_limits<A>::infinity() : std::numeric_limits<A>::lowest();
  if (op == reduce_op::min) return std::numeric_limits<A>::has_infinity ? std::numeric_limits<A>::infinity() : std::numeric_limits<A>::max();
  return A(0);
}

template <class A> __device__ inline A combine(reduce_op op, A x, A y) {
  if (op == reduce_op::max) return max_op{}(x, y);
  if (op == reduce_op::min) return min_op{}(x, y);
  return x + y;
}

template <class T, class A> __device__ inline T finish(reduce_op op, A v, std::int64_t n) {
  if (op == reduce_op::mean) return store_as<T>(static_cast<double>(v) / static_cast<double>(n));
  return store_as<T>(v);
}

template <class T>
__global__ void reduce_block_kernel(reduce_op op, T* out, const T* a, reduce_geometry g) {
  using A = acc_t<T>;
  __shared__ A shared[32];
  for (std::int64_t o = blockIdx.x; o < g.n_out; o += gridDim.x) {
    std::int64_t off[2];
    offsets_of(g.outer, o, off);
    A v = identity_of<A>(op);
    for (std::int64_t j = threadIdx.x; j < g.n_in; j += blockDim.x)
      v = combine(op, v, load_acc(a[off[1] + inner_offset(g.inner, j)]));
    if (op == reduce_op::max) v = block_reduce(v, max_op{}, identity_of<A>(op), shared);
    else if (op == reduce_op::min) v = block_reduce(v, min_op{}, identity_of<A>(op), shared);
    else v = block_reduce(v, sum_op{}, A(0), shared);
    if (threadIdx.x == 0) out[off[0]] = finish<T>(op, v, g.n_in);
  }
}

template <class T>
__global__ void reduce_thread_kernel(reduce_op op, T* out, const T* a, reduce_geometry g) {
  using A = acc_t<T>;
  for (std::int64_t o = global_index(); o < g.n_out; o += grid_stride()) {
    std::int64_t off[2];
    offsets_of(g.outer, o, off);
    A v = identity_of<A>(op);
    for (std::int64_t j = 0; j < g.n_in; ++j) v = combine(op, v, load_acc(a[off[1] + inner_offset(g.inner, j)]));
    out[off[0]] = finish<T>(op, v, g.n_in);
  }
}

// ---- two-stage reduction (few outputs, many elements each) ----------------------------------
//
// Stage 1: block (c, o) reduces chunk c of output o's elements into partial[o * chunks + c],
// an acc_t<T>. Stage 2: one block per output combines its partials and finishes. The mean
// divides by the full count.
constexpr std::int64_t chunk_elems = 16384;

template <class T>
__global__ void reduce_partial_kernel(reduce_op op, acc_t<T>* partial, const T* a, reduce_geometry g, std::int64_t chunks) {
  using A = acc_t<T>;
  __shared__ A shared[32];
  const std::int64_t c = blockIdx.x, o = blockIdx.y;
  std::int64_t off[2];
  offsets_of(g.outer, o, off);
  const std::int64_t begin = c * chunk_elems, end = begin + chunk_elems < g.n_in ? begin + chunk_elems : g.n_in;
  A v = identity_of<A>(op);
  for (std::int64_t j = begin + threadIdx.x; j < end; j += blockDim.x)
    v = combine(op, v, load_acc(a[off[1] + inner_offset(g.inner, j)]));
  if (op == reduce_op::max) v = block_reduce(v, max_op{}, identity_of<A>(op), shared);
  else if (op == reduce_op::min) v = block_reduce(v, min_op{}, identity_of<A>(op), shared);
  else v = block_reduce(v, sum_op{}, A(0), shared);
  if (threadIdx.x == 0) partial[o * chunks + c] = v;
}

template <class T>
__global__ void reduce_finish_kernel(reduce_op op, T* out, const acc_t<T>* partial, reduce_geometry g, std::int64_t chunks) {
  using A = acc_t<T>;
  __shared__ A shared[32];
  const std::int64_t o = blockIdx.x;
  std::int64_t off[2];
  offsets_of(g.outer, o, off);
  A v = identity_of<A>(op);
  for (std::int64_t c = threadIdx.x; c < chunks; c += blockDim.x) v = combine(op, v, partial[o * chunks + c]);
  if (op == reduce_op::max) v = block_reduce(v, max_op{}, identity_of<A>(op), shared);
  else if (op == reduce_op::min) v = block_reduce(v, min_op{}, identity_of<A>(op), shared);
  else v = block_reduce(v, sum_op{}, A(0), shared);
  if (threadIdx.x == 0) out[off[0]] = finish<T>(op, v, g.n_in);
}

template <class A> constexpr dtype dtype_of_acc() {
  if constexpr (std::is_same_v<A, float>) return dtype::float32;
  else if constexpr (std::is_same_v<A, double>) return dtype::float64;
  else return dtype::int64;
}

template <class T>
void reduce_two_stage(reduce_op op, const tensor& out, const tensor& a, const reduce_geometry& g, int dev, cudaStream_t s) {
  using A = acc_t<T>;
  const std::int64_t chunks = (g.n_in + chunk_elems - 1) / chunk_elems;
  const tensor partial = scratch({g.n_out, chunks}, dtype_of_acc<A>(), out);
  const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(g.n_out));
  reduce_partial_kernel<T><<<grid, reduce_threads, 0, s>>>(op, ptr<A>(partial), ptr<T>(a), g, chunks);
  TROUPE_CUDA_CHECK_LAUNCH();
  reduce_finish_kernel<T><<<static_cast<unsigned>(g.n_out), reduce_threads, 0, s>>>(op, ptr<T>(out), ptr<A>(partial), g, chunks);
  TROUPE_CUDA_CHECK_LAUNCH();
}

bool wants_two_stage(const reduce_geometry& g) {
  // Few outputs (one block each would leave the GPU idle), many elements, grid limits respected.
  return g.n_out <= 64 && g.n_in >= 4 * chunk_elems && (g.n_in + chunk_elems - 1) / chunk_elems <= INT32_MAX;
}

int blocks_for(std::int64_t n_out) {
  return static_cast<int>(std::min<std::int64_t>(n_out, std::int64_t{1} << 20));
}

// ---- arg_reduce ------------------------------------------------------------------------------

// True when (x, i) wins over (y, j): larger (smaller) value, NaN beats numbers, ties go to the
// smaller index.
template <class A> __device__ inline bool arg_better(bool is_max, A x, std::int64_t i, A y, std::int64_t j) {
  if (j < 0) return i >= 0;
  if (i < 0) return false;
  if constexpr (std::is_floating_point_v<A>) {
    const bool xn = x != x, yn = y != y;
    if (xn || yn) return xn && (!yn || i < j);
  }
  if (x == y) return i < j;
  return is_max ? x > y : x < y;
}

template <class T>
__global__ void arg_reduce_kernel(bool is_max, std::int64_t* out, const T* a, reduce_geometry g) {
  using A = acc_t<T>;
  __shared__ A sv[reduce_threads];
  __shared__ std::int64_t si[reduce_threads];
  for (std::int64_t o = blockIdx.x; o < g.n_out; o += gridDim.x) {
    std::int64_t off[2];
    offsets_of(g.outer, o, off);
    A v = A(0);
    std::int64_t idx = -1;
    for (std::int64_t j = threadIdx.x; j < g.n_in; j += blockDim.x) {
      const A x = load_acc(a[off[1] + inner_offset(g.inner, j)]);
      if (arg_better(is_max, x, j, v, idx)) { v = x; idx = j; }
    }
    __syncthreads();
    sv[threadIdx.x] = v;
    si[threadIdx.x] = idx;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (static_cast<int>(threadIdx.x) < s && arg_better(is_max, sv[threadIdx.x + s], si[threadIdx.x + s], sv[threadIdx.x], si[threadIdx.x])) {
        sv[threadIdx.x] = sv[threadIdx.x + s];
        si[threadIdx.x] = si[threadIdx.x + s];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) out[off[0]] = si[0];
  }
}

// ---- var -----------------------------------------------------------------------------------------

template <class T>
__global__ void var_kernel(T* out, const T* a, reduce_geometry g, double divisor) {
  __shared__ double shared[32];
  for (std::int64_t o = blockIdx.x; o < g.n_out; o += gridDim.x) {
    std::int64_t off[2];
    offsets_of(g.outer, o, off);
    double s = 0;
    for (std::int64_t j = threadIdx.x; j < g.n_in; j += blockDim.x)
      s += static_cast<double>(load_acc(a[off[1] + inner_offset(g.inner, j)]));
    const double mean = block_reduce(s, sum_op{}, 0.0, shared) / static_cast<double>(g.n_in);
    double q = 0;
    for (std::int64_t j = threadIdx.x; j < g.n_in; j += blockDim.x) {
      const double d = static_cast<double>(load_acc(a[off[1] + inner_offset(g.inner, j)])) - mean;
      q += d * d;
    }
    q = block_reduce(q, sum_op{}, 0.0, shared);
    if (threadIdx.x == 0) out[off[0]] = store_as<T>(q / divisor);
  }
}

}  // namespace

void reduce(reduce_op op, const tensor& out, const tensor& a, const shape_t& dims) {
  const reduce_geometry g = geometry_of(out, a, dims, "reduce");
  if (g.n_out == 0) return;
  if (g.n_in == 0) {  // empty slices: sum 0, mean NaN (max/min of empty are rejected by the op layer)
    fill(out, op == reduce_op::mean ? std::numeric_limits<double>::quiet_NaN() : 0.0);
    return;
  }
  const int dev = device_of(out);
  device_guard guard(dev);
  const cudaStream_t s = stream_of(dev);
  visit_device_dtype(a.dtype(), [&](auto t) {
    using T = typename decltype(t)::type;
    if (wants_two_stage(g))
      reduce_two_stage<T>(op, out, a, g, dev, s);
    else if (g.n_in <= 32 && g.n_out >= 1024)
      reduce_thread_kernel<T><<<grid_for(g.n_out, dev), block_threads, 0, s>>>(op, ptr<T>(out), ptr<T>(a), g);
    else
      reduce_block_kernel<T><<<blocks_for(g.n_out), reduce_threads, 0, s>>>(op, ptr<T>(out), ptr<T>(a), g);
    TROUPE_CUDA_CHECK_LAUNCH();
  });
}

void arg_reduce(bool is_max, const tensor& out, const tensor& a, std::int64_t dim) {
  const reduce_geometry g = geometry_of(out, a, {dim}, is_max ? "argmax" : "argmin");
  if (g.n_out == 0 || g.n_in == 0) return;
  const int dev = device_of(out);
  device_guard guard(dev);
  visit_device_dtype(a.dtype(), [&](auto t) {
    using T = typename decltype(t)::type;
    arg_reduce_kernel<T><<<blocks_for(g.n_out), reduce_threads, 0, stream_of(dev)>>>(is_max, ptr<std::int64_t>(out), ptr<T>(a), g);
    TROUPE_CUDA_CHECK_LAUNCH();
  });
}

void var(const tensor& out, const tensor& a, const shape_t& dims, std::int64_t correction) {
  const reduce_geometry g = geometry_of(out, a, dims, "var");
  if (g.n_out == 0) return;
  if (g.n_in == 0) {
    fill(out, std::numeric_limits<double>::quiet_NaN());
    return;
  }
  const double divisor = static_cast<double>(std::max<std::int64_t>(0, g.n_in - correction));
  const int dev = device_of(out);
  device_guard guard(dev);
  visit_device_dtype(a.dtype(), [&](auto t) {
    using T = typename decltype(t)::type;
    var_kernel<T><<<blocks_for(g.n_out), reduce_threads, 0, stream_of(dev)>>>(ptr<T>(out), ptr<T>(a), g, divisor);
    TROUPE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace troupe::kernels::cuda
