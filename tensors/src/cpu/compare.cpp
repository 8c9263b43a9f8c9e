// CPU kernels: comparisons (bool output) and where.
// Not hot in training; the generic row walk of Note [CPU loops] with a strided inner loop is
// enough (GCC still vectorises the unit-stride float compare rows at -O3).
#include "../kernels.hpp"
#include "loops.hpp"

namespace troupe::kernels::cpu {

namespace {
using namespace detail;

template <class F>
void with_compare_fn(compare_op op, F&& f) {
  switch (op) {
    case compare_op::eq: f([](auto x, auto y) { return x == y; }); return;
    case compare_op::ne: f([](auto x, auto y) { return x != y; }); return;
    case compare_op::lt: f([](auto x, auto y) { return x < y; }); return;
    case compare_op::le: f([](auto x, auto y) { return x <= y; }); return;
    case compare_op::gt: f([](auto x, auto y) { return x > y; }); return;
    case compare_op::ge: f([](auto x, auto y) { return x >= y; }); return;
  }
}
}  // namespace

void compare(compare_op op, const tensor& out, const tensor& a, const tensor& b) {
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    with_compare_fn(op, [&](auto f) {
      for_each_row<3>({&out, &a, &b}, [&](std::array<char*, 3> p, std::int64_t n, const std::array<std::int64_t, 3>& s) {
        bool* o = reinterpret_cast<bool*>(p[0]);
        const T* x = reinterpret_cast<const T*>(p[1]);
        const T* y = reinterpret_cast<const T*>(p[2]);
        for (std::int64_t i = 0; i < n; ++i) o[i * s[0]] = f(load(x + i * s[1]), load(y + i * s[2]));
      });
    });
  });
}

void where(const tensor& out, const tensor& cond, const tensor& a, const tensor& b) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    for_each_row<4>({&out, &cond, &a, &b}, [&](std::array<char*, 4> p, std::int64_t n, const std::array<std::int64_t, 4>& s) {
      T* o = reinterpret_cast<T*>(p[0]);
      const bool* c = reinterpret_cast<const bool*>(p[1]);
      const T* x = reinterpret_cast<const T*>(p[2]);
      const T* y = reinterpret_cast<const T*>(p[3]);
      for (std::int64_t i = 0; i < n; ++i) o[i * s[0]] = c[i * s[1]] ? x[i * s[2]] : y[i * s[3]];
    });
  });
}

}  // namespace troupe::kernels::cpu
