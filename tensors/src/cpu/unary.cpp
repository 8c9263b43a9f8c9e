// CPU kernels: unary elementwise math.
//
// Vectorisation check (g++ 12, -O3, SSE2 baseline): -fopt-info-vec-optimized reports the
// contiguous loop vectorized (16-byte vectors) for neg/abs/relu/sign on float and double
// (relu: maxps/andps-style selects). exp/log/tanh/erf call libm per element and are not
// vectorised without -ffast-math/libmvec, which we do not enable (results must match the
// float64 reference within tolerance on every machine).
#include <cmath>

#include "../kernels.hpp"
#include "loops.hpp"

namespace troupe::kernels::cpu {

namespace {
using namespace detail;

template <class C> C gelu_exact(C x) {
  const double xd = static_cast<double>(x);
  return static_cast<C>(0.5 * xd * (1.0 + std::erf(xd * 0.70710678118654752440)));
}

template <class F>
void with_unary_fn(unary_op op, F&& f) {
  switch (op) {
    case unary_op::neg: f([](auto x) { return static_cast<decltype(x)>(-x); }); return;
    case unary_op::abs: f([](auto x) { return x < decltype(x){} ? static_cast<decltype(x)>(-x) : x; }); return;
    case unary_op::exp: f([](auto x) { return static_cast<decltype(x)>(std::exp(x)); }); return;
    case unary_op::log: f([](auto x) { return static_cast<decltype(x)>(std::log(x)); }); return;
    case unary_op::sqrt: f([](auto x) { return static_cast<decltype(x)>(std::sqrt(x)); }); return;
    case unary_op::rsqrt: f([](auto x) { using C = decltype(x); return static_cast<C>(C{1} / std::sqrt(x)); }); return;
    case unary_op::relu: f([](auto x) { return x > decltype(x){} ? x : decltype(x){}; }); return;
    case unary_op::sigmoid:
      f([](auto x) { using C = decltype(x); return static_cast<C>(C{1} / (C{1} + std::exp(-x))); });
      return;
    case unary_op::tanh: f([](auto x) { return static_cast<decltype(x)>(std::tanh(x)); }); return;
    case unary_op::gelu: f([](auto x) { return gelu_exact(x); }); return;
    case unary_op::sign:
      f([](auto x) { using C = decltype(x); return static_cast<C>((C{} < x) - (x < C{})); });
      return;
  }
}

template <class T, class F>
void contiguous_loop(T* __restrict o, const T* __restrict a, std::int64_t n, F f) {
  for (std::int64_t i = 0; i < n; ++i) store(o + i, f(load(a + i)));
}

template <class T, class F>
void unary_typed(const tensor& out, const tensor& a, F f) {
  for_each_row<2>({&out, &a}, [&](std::array<char*, 2> p, std::int64_t n, const std::array<std::int64_t, 2>& s) {
    T* o = reinterpret_cast<T*>(p[0]);
    const T* x = reinterpret_cast<const T*>(p[1]);
    if (s[0] == 1 && s[1] == 1) contiguous_loop(o, x, n, f);
    else
      for (std::int64_t i = 0; i < n; ++i) store(o + i * s[0], f(load(x + i * s[1])));
  });
}
}  // namespace

void unary(unary_op op, const tensor& out, const tensor& a) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, bool>) {
      // Only abs/relu/sign reach here for bool (the op layer converts the rest): identity.
      (void)op;
      unary_typed<T>(out, a, [](auto x) { return x; });
    } else {  // integers: the op layer only sends neg/abs/relu/sign
      with_unary_fn(op, [&](auto f) { unary_typed<T>(out, a, f); });
    }
  });
}

}  // namespace troupe::kernels::cpu
