// CPU kernels: softmax and log_softmax along one dim (numerically stable: the slice maximum
// is subtracted before exponentiating). Each slice is computed in float for 16-bit floats and
// float32 (sum accumulated in double), in double for float64.
#include <cmath>
#include <limits>

#include "../kernels.hpp"
#include "loops.hpp"

namespace troupe::kernels::cpu {

namespace {
using namespace detail;

template <class T>
void softmax_slice(T* o, std::int64_t os, const T* x, std::int64_t xs, std::int64_t n, bool log) {
  using C = compute_t<T>;
  C mx = -std::numeric_limits<C>::infinity();
  for (std::int64_t i = 0; i < n; ++i) mx = std::max(mx, load(x + i * xs));
  if (std::isinf(mx) && mx < 0) mx = 0;  // all -inf: exp gives 0s, as PyTorch (NaN after /0)
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) sum += static_cast<double>(std::exp(load(x + i * xs) - mx));
  if (log) {
    const C lse = static_cast<C>(std::log(sum));
    for (std::int64_t i = 0; i < n; ++i) store(o + i * os, load(x + i * xs) - mx - lse);
  } else {
    const C inv = static_cast<C>(1.0 / sum);
    for (std::int64_t i = 0; i < n; ++i) store(o + i * os, std::exp(load(x + i * xs) - mx) * inv);
  }
}
}  // namespace

void softmax(const tensor& out, const tensor& a, std::int64_t dim, bool log) {
  if (a.numel() == 0) return;
  // Walk all slices: the shape with `dim` set to 1 indexes them.
  shape_t sizes = a.sizes();
  const std::int64_t n = sizes[static_cast<std::size_t>(dim)];
  const std::int64_t xs = a.stride(dim), os = out.stride(dim);
  sizes[static_cast<std::size_t>(dim)] = 1;
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_floating_point_v<compute_t<T>>) {
      const auto plan = make_plan<2>(sizes, {&out.strides(), &a.strides()});
      for_each_row(plan, {static_cast<char*>(out.data_ptr()), static_cast<char*>(a.data_ptr())}, {sizeof(T), sizeof(T)},
                   [&](std::array<char*, 2> p, std::int64_t rows, const std::array<std::int64_t, 2>& s) {
                     for (std::int64_t r = 0; r < rows; ++r)
                       softmax_slice(reinterpret_cast<T*>(p[0]) + r * s[0], os,
                                     reinterpret_cast<const T*>(p[1]) + r * s[1], xs, n, log);
                   });
    }
  });
}

}  // namespace troupe::kernels::cpu
