// CPU kernels: copy (with dtype conversion) and fill.
//
// Vectorisation check (g++ 12, -O3, SSE2): same-dtype contiguous copies are one memcpy;
// -fopt-info-vec-optimized reports the contiguous conversion loops (float<->double,
// int<->float) and the contiguous fill loop vectorized with 16-byte vectors.
#include <cstring>

#include "../kernels.hpp"
#include "loops.hpp"

namespace troupe::kernels::cpu {

namespace {
using namespace detail;

template <class D, class S> D convert(S v) {
  if constexpr (std::is_same_v<D, S>) return v;
  else if constexpr (std::is_same_v<S, half> || std::is_same_v<S, bfloat16>) return from_double<D>(static_cast<float>(v));
  else if constexpr (std::is_same_v<D, half> || std::is_same_v<D, bfloat16>) return D(static_cast<float>(v));
  else if constexpr (std::is_same_v<D, bool>) return v != S{};
  else return static_cast<D>(v);
}

template <class D, class S>
void contiguous_convert(D* __restrict d, const S* __restrict s, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) d[i] = convert<D>(s[i]);
}

template <class T>
void contiguous_fill(T* __restrict d, T v, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) d[i] = v;
}
}  // namespace

void copy(const tensor& dst, const tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  visit_dtype(dst.dtype(), [&](auto dtag) {
    using D = decltype(dtag);
    visit_dtype(src.dtype(), [&](auto stag) {
      using S = decltype(stag);
      for_each_row<2>({&dst, &src}, [&](std::array<char*, 2> p, std::int64_t n, const std::array<std::int64_t, 2>& s) {
        D* d = reinterpret_cast<D*>(p[0]);
        const S* x = reinterpret_cast<const S*>(p[1]);
        if (s[0] == 1 && s[1] == 1) contiguous_convert(d, x, n);
        else
          for (std::int64_t i = 0; i < n; ++i) d[i * s[0]] = convert<D>(x[i * s[1]]);
      });
    });
  });
}

void fill(const tensor& out, double value) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = from_double<T>(value);
    for_each_row<1>({&out}, [&](std::array<char*, 1> p, std::int64_t n, const std::array<std::int64_t, 1>& s) {
      T* d = reinterpret_cast<T*>(p[0]);
      if (s[0] == 1) contiguous_fill(d, v, n);
      else
        for (std::int64_t i = 0; i < n; ++i) d[i * s[0]] = v;
    });
  });
}

}  // namespace troupe::kernels::cpu
