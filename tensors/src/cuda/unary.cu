// Unary math kernels (kernels::cuda::unary), computed in acc_t<T>; integer inputs of
// transcendental ops are computed in double and converted back.
#include "../kernels.hpp"
#include "elementwise.cuh"

namespace troupe::kernels::cuda {

using namespace troupe::cuda_detail;

namespace {

template <class A> __device__ inline A apply_float(unary_op op, A x) {
  switch (op) {
    case unary_op::neg: return -x;
    case unary_op::abs: return x < A(0) ? -x : x;
    case unary_op::exp: return ::exp(x);
    case unary_op::log: return ::log(x);
    case unary_op::sqrt: return ::sqrt(x);
    case unary_op::rsqrt: return A(1) / ::sqrt(x);
    case unary_op::relu: return x > A(0) ? x : (x != x ? x : A(0));
    case unary_op::sigmoid: return A(1) / (A(1) + ::exp(-x));
    case unary_op::tanh: return ::tanh(x);
    case unary_op::gelu: return A(0.5) * x * (A(1) + ::erf(x * A(0.70710678118654752440)));
    case unary_op::sign: return x > A(0) ? A(1) : x < A(0) ? A(-1) : x;  // keeps 0 and NaN
  }
  return x;
}

template <class A> __device__ inline A apply_unary(unary_op op, A x) {
  if constexpr (std::is_floating_point_v<A>) {
    return apply_float<A>(op, x);
  } else {
    switch (op) {
      case unary_op::neg: return -x;
      case unary_op::abs: return x < 0 ? -x : x;
      case unary_op::relu: return x > 0 ? x : A(0);
      case unary_op::sign: return x > 0 ? A(1) : x < 0 ? A(-1) : A(0);
      default: return static_cast<A>(apply_float<double>(op, static_cast<double>(x)));
    }
  }
}

template <class T> struct unary_fn {
  unary_op op;
  T* out;
  const T* a;
  __device__ void operator()(std::int64_t i) const { out[i] = store_as<T>(apply_unary(op, load_acc(a[i]))); }
  __device__ void operator()(const std::int64_t (&o)[2]) const {
    out[o[0]] = store_as<T>(apply_unary(op, load_acc(a[o[1]])));
  }
};

void run(unary_op op, const tensor& out, const tensor& a) {
  visit_device_dtype(a.dtype(), [&](auto t) {
    using T = typename decltype(t)::type;
    run_elementwise<2>({&out, &a}, unary_fn<T>{op, ptr<T>(out), ptr<T>(a)}, "unary");
  });
}

}  // namespace

void unary(unary_op op, const tensor& out, const tensor& a) {
  if (out.dtype() != a.dtype()) {  // e.g. exp of an integer tensor into float: compute, convert
    tensor tmp = scratch(out.shape(), a.dtype(), out);
    run(op, tmp, a);
    copy(out, tmp);
    return;
  }
  run(op, out, a);
}

}  // namespace troupe::kernels::cuda
