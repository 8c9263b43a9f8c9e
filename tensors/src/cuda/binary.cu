// Binary arithmetic kernels (kernels::cuda::binary / binary_scalar), computed in acc_t<T>.
#include "../kernels.hpp"
#include "elementwise.cuh"

namespace troupe::kernels::cuda {

using namespace troupe::cuda_detail;

namespace {

template <class A> __device__ inline A int_pow(A base, A exp) {
  if (exp < 0) return base == 1 ? A(1) : base == -1 ? ((exp & 1) ? A(-1) : A(1)) : A(0);
  A r = 1;
  while (exp) {
    if (exp & 1) r *= base;
    exp >>= 1;
    if (exp) base *= base;
  }
  return r;
}

template <class A> __device__ inline A apply_binary(binary_op op, A x, A y, A alpha) {
  constexpr bool fp = std::is_floating_point_v<A>;
  switch (op) {
    case binary_op::add: return x + alpha * y;
    case binary_op::sub: return x - alpha * y;
    case binary_op::mul: return x * y;
    case binary_op::div:
      if constexpr (fp) return x / y;
      else return y == 0 ? A(0) : x / y;  // integer division by zero is defined as 0 here
    case binary_op::pow:
      if constexpr (fp) return ::pow(x, y);
      else return int_pow(x, y);
    case binary_op::maximum:
      if constexpr (fp) { if (x != x || y != y) return x + y; }  // NaN propagates
      return x > y ? x : y;
    case binary_op::minimum:
      if constexpr (fp) { if (x != x || y != y) return x + y; }
      return x < y ? x : y;
  }
  return x;
}

template <class T> struct binary_fn {
  using A = acc_t<T>;
  binary_op op;
  T* out;
  const T* a;
  const T* b;  // null: use b_scalar
  A b_scalar;
  A alpha;

  __device__ A rhs(std::int64_t off) const { return b ? load_acc(b[off]) : b_scalar; }
  __device__ void operator()(std::int64_t i) const {
    out[i] = store_as<T>(apply_binary<A>(op, load_acc(a[i]), rhs(i), alpha));
  }
  __device__ void operator()(const std::int64_t (&o)[3]) const {
    out[o[0]] = store_as<T>(apply_binary<A>(op, load_acc(a[o[1]]), rhs(o[2]), alpha));
  }
};

template <class T, int V> struct alignas(sizeof(T) * V) pack { T v[V]; };

// Contiguous fast path: 16-byte vector loads/stores, then the tail element by element.
template <class T>
__global__ void binary_vec_kernel(binary_fn<T> f, std::int64_t n) {
  constexpr int V = 16 / sizeof(T);
  using P = pack<T, V>;
  using A = acc_t<T>;
  const std::int64_t nvec = n / V;
  for (std::int64_t i = global_index(); i < nvec; i += grid_stride()) {
    const P x = reinterpret_cast<const P*>(f.a)[i];
    P y;
    if (f.b) y = reinterpret_cast<const P*>(f.b)[i];
    P r;
#pragma unroll
    for (int k = 0; k < V; ++k)
      r.v[k] = store_as<T>(apply_binary<A>(f.op, load_acc(x.v[k]), f.b ? load_acc(y.v[k]) : f.b_scalar, f.alpha));
    reinterpret_cast<P*>(f.out)[i] = r;
  }
  for (std::int64_t i = nvec * V + global_index(); i < n; i += grid_stride()) f(i);
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

template <class T>
void launch_binary(const binary_fn<T>& f, const tensor& out, const tensor& a, const tensor* b) {
  const std::int64_t n = out.numel();
  if (n == 0) return;
  const bool contiguous = out.is_contiguous() && a.is_contiguous() && (!b || b->is_contiguous());
  if (contiguous && aligned16(f.out) && aligned16(f.a) && (!f.b || aligned16(f.b))) {
    const int dev = device_of(out);
    device_guard guard(dev);
    const std::int64_t work = n / (16 / static_cast<std::int64_t>(sizeof(T))) + 1;
    binary_vec_kernel<T><<<grid_for(work, dev), block_threads, 0, stream_of(dev)>>>(f, n);
    TROUPE_CUDA_CHECK_LAUNCH();
  } else if (b) {
    run_elementwise<3>({&out, &a, b}, f, "binary");
  } else {
    run_elementwise<3>({&out, &a, &a}, f, "binary_scalar");
  }
}

template <class A> A scalar_as(double v) {
  if constexpr (std::is_floating_point_v<A>) return static_cast<A>(v);
  else return static_cast<A>(static_cast<std::int64_t>(v));
}

void run(binary_op op, const tensor& out, const tensor& a, const tensor* b, double b_scalar, double alpha) {
  visit_device_dtype(out.dtype(), [&](auto t) {
    using T = typename decltype(t)::type;
    using A = acc_t<T>;
    const binary_fn<T> f{op, ptr<T>(out), ptr<T>(a), b ? ptr<T>(*b) : nullptr, scalar_as<A>(b_scalar), scalar_as<A>(alpha)};
    launch_binary<T>(f, out, a, b);
  });
}

// The contract gives out the dtype of a; if a caller passes another, compute into a scratch
// tensor of a's dtype and convert (one extra pass, never wrong).
bool needs_scratch(const tensor& out, const tensor& a) { return out.dtype() != a.dtype(); }

}  // namespace

void binary(binary_op op, const tensor& out, const tensor& a, const tensor& b, double alpha) {
  if (needs_scratch(out, a)) {
    tensor tmp = scratch(out.shape(), a.dtype(), out);
    run(op, tmp, a, &b, 0.0, alpha);
    copy(out, tmp);
    return;
  }
  run(op, out, a, &b, 0.0, alpha);
}

void binary_scalar(binary_op op, const tensor& out, const tensor& a, double b) {
  if (needs_scratch(out, a)) {
    tensor tmp = scratch(out.shape(), a.dtype(), out);
    run(op, tmp, a, nullptr, b, 1.0);
    copy(out, tmp);
    return;
  }
  run(op, out, a, nullptr, b, 1.0);
}

}  // namespace troupe::kernels::cuda
