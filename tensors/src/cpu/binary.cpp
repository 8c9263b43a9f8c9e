// CPU kernels: binary arithmetic (tensor-tensor and tensor-scalar).
//
// Vectorisation check (g++ 12, -O3, SSE2 baseline, no -march=native), done once with
//   g++ ... -O3 -fopt-info-vec-optimized -c tensors/src/cpu/binary.cpp
// reports "loop vectorized using 16 byte vectors" for contiguous_loop / scalar_b_loop
// instantiated for float and double (add, sub, mul, div, maximum/minimum), and objdump shows
// addps/mulps/divps in them. pow goes through std::pow (a libm call) and is not vectorised.
#include <cmath>

#include "../kernels.hpp"
#include "loops.hpp"

namespace troupe::kernels::cpu {

namespace {
using namespace detail;

struct add_f { template <class C> C operator()(C a, C b) const { return a + b; } };
struct sub_f { template <class C> C operator()(C a, C b) const { return a - b; } };
struct mul_f { template <class C> C operator()(C a, C b) const { return a * b; } };
struct add_alpha_f {
  double alpha;
  template <class C> C operator()(C a, C b) const { return a + static_cast<C>(alpha) * b; }
};
struct div_f {
  template <class C> C operator()(C a, C b) const {
    if constexpr (std::is_integral_v<C>) return b == 0 ? C{0} : static_cast<C>(a / b);  // op layer sends floats
    else return a / b;
  }
};
struct pow_f {
  template <class C> C operator()(C a, C b) const {
    return static_cast<C>(std::pow(static_cast<double>(a), static_cast<double>(b)));
  }
};
struct pow_float_f {  // float pow in float: cheaper, same rounding as PyTorch's powf
  template <class C> C operator()(C a, C b) const {
    if constexpr (std::is_same_v<C, float>) return std::pow(a, b);
    else return static_cast<C>(std::pow(static_cast<double>(a), static_cast<double>(b)));
  }
};
// NaN-propagating, as torch.maximum/minimum.
struct max_f { template <class C> C operator()(C a, C b) const { return a != a ? a : (b != b ? b : (a > b ? a : b)); } };
struct min_f { template <class C> C operator()(C a, C b) const { return a != a ? a : (b != b ? b : (a < b ? a : b)); } };

template <class F>
void with_binary_fn(binary_op op, double alpha, F&& f) {
  switch (op) {
    case binary_op::add: if (alpha == 1.0) f(add_f{}); else f(add_alpha_f{alpha}); return;
    case binary_op::sub: if (alpha == 1.0) f(sub_f{}); else f(add_alpha_f{-alpha}); return;
    case binary_op::mul: f(mul_f{}); return;
    case binary_op::div: f(div_f{}); return;
    case binary_op::pow: f(pow_float_f{}); return;
    case binary_op::maximum: f(max_f{}); return;
    case binary_op::minimum: f(min_f{}); return;
  }
}

// out may be exactly `a` (in-place forms); each o[i] depends only on a[i], b[i], so the
// __restrict promise holds for every access the loop makes.
template <class T, class F>
void contiguous_loop(T* __restrict o, const T* __restrict a, const T* __restrict b, std::int64_t n, F f) {
  for (std::int64_t i = 0; i < n; ++i) store(o + i, f(load(a + i), load(b + i)));
}
template <class T, class F>
void scalar_b_loop(T* __restrict o, const T* __restrict a, compute_t<T> b, std::int64_t n, F f) {
  for (std::int64_t i = 0; i < n; ++i) store(o + i, f(load(a + i), b));
}
template <class T, class F>
void scalar_a_loop(T* __restrict o, compute_t<T> a, const T* __restrict b, std::int64_t n, F f) {
  for (std::int64_t i = 0; i < n; ++i) store(o + i, f(a, load(b + i)));
}

template <class T, class F>
void binary_typed(const tensor& out, const tensor& a, const tensor& b, F f) {
  for_each_row<3>({&out, &a, &b}, [&](std::array<char*, 3> p, std::int64_t n, const std::array<std::int64_t, 3>& s) {
    T* o = reinterpret_cast<T*>(p[0]);
    const T* x = reinterpret_cast<const T*>(p[1]);
    const T* y = reinterpret_cast<const T*>(p[2]);
    if (s[0] == 1 && s[1] == 1 && s[2] == 1) contiguous_loop(o, x, y, n, f);
    else if (s[0] == 1 && s[1] == 1 && s[2] == 0) scalar_b_loop(o, x, load(y), n, f);
    else if (s[0] == 1 && s[1] == 0 && s[2] == 1) scalar_a_loop(o, load(x), y, n, f);
    else
      for (std::int64_t i = 0; i < n; ++i) store(o + i * s[0], f(load(x + i * s[1]), load(y + i * s[2])));
  });
}

template <class T, class F>
void binary_scalar_typed(const tensor& out, const tensor& a, double b, F f) {
  const auto bc = static_cast<compute_t<T>>(b);
  for_each_row<2>({&out, &a}, [&](std::array<char*, 2> p, std::int64_t n, const std::array<std::int64_t, 2>& s) {
    T* o = reinterpret_cast<T*>(p[0]);
    const T* x = reinterpret_cast<const T*>(p[1]);
    if (s[0] == 1 && s[1] == 1) scalar_b_loop(o, x, bc, n, f);
    else
      for (std::int64_t i = 0; i < n; ++i) store(o + i * s[0], f(load(x + i * s[1]), bc));
  });
}
}  // namespace

void binary(binary_op op, const tensor& out, const tensor& a, const tensor& b, double alpha) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    with_binary_fn(op, alpha, [&](auto f) { binary_typed<T>(out, a, b, f); });
  });
}

void binary_scalar(binary_op op, const tensor& out, const tensor& a, double b) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (op == binary_op::pow && b == 2.0) {  // the common square: a multiply, vectorisable
      binary_scalar_typed<T>(out, a, 0.0, [](auto x, auto) { return x * x; });
      return;
    }
    with_binary_fn(op, 1.0, [&](auto f) { binary_scalar_typed<T>(out, a, b, f); });
  });
}

}  // namespace troupe::kernels::cpu
