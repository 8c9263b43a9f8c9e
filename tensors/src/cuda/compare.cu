// Comparison kernels (bool output) and where (selection, dispatched on element size only).
#include "../kernels.hpp"
#include "elementwise.cuh"

namespace troupe::kernels::cuda {

using namespace troupe::cuda_detail;

namespace {

template <class A> __device__ inline bool apply_compare(compare_op op, A x, A y) {
  switch (op) {
    case compare_op::eq: return x == y;
    case compare_op::ne: return x != y;
    case compare_op::lt: return x < y;
    case compare_op::le: return x <= y;
    case compare_op::gt: return x > y;
    case compare_op::ge: return x >= y;
  }
  return false;
}

template <class T> struct compare_fn {
  compare_op op;
  bool* out;
  const T* a;
  const T* b;
  __device__ void operator()(std::int64_t i) const { out[i] = apply_compare(op, load_acc(a[i]), load_acc(b[i])); }
  __device__ void operator()(const std::int64_t (&o)[3]) const {
    out[o[0]] = apply_compare(op, load_acc(a[o[1]]), load_acc(b[o[2]]));
  }
};

// Selection moves bits, so one instantiation per element size serves every dtype.
template <class U> struct where_fn {
  U* out;
  const bool* cond;
  const U* a;
  const U* b;
  __device__ void operator()(std::int64_t i) const { out[i] = cond[i] ? a[i] : b[i]; }
  __device__ void operator()(const std::int64_t (&o)[4]) const { out[o[0]] = cond[o[1]] ? a[o[2]] : b[o[3]]; }
};

}  // namespace

void compare(compare_op op, const tensor& out, const tensor& a, const tensor& b) {
  visit_device_dtype(a.dtype(), [&](auto t) {
    using T = typename decltype(t)::type;
    run_elementwise<3>({&out, &a, &b}, compare_fn<T>{op, ptr<bool>(out), ptr<T>(a), ptr<T>(b)}, "compare");
  });
}

void where(const tensor& out, const tensor& cond, const tensor& a, const tensor& b) {
  visit_size(out.element_size(), [&](auto t) {
    using U = typename decltype(t)::type;
    run_elementwise<4>({&out, &cond, &a, &b}, where_fn<U>{ptr<U>(out), ptr<bool>(cond), ptr<U>(a), ptr<U>(b)}, "where");
  });
}

}  // namespace troupe::kernels::cuda
