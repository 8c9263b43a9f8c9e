// Reduction kernels of the CPU process group (blocked so outputs may alias inputs).
#include "reduce_kernels.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace troupe::ddp::detail {

namespace {

constexpr std::size_t block = 2048;

template <class T> struct acc_of { using type = T; };
template <> struct acc_of<half> { using type = float; };
template <> struct acc_of<bfloat16> { using type = float; };
template <> struct acc_of<bool> { using type = std::uint8_t; };

template <class T, class A>
A load(const T& v) {
  if constexpr (std::is_same_v<T, bool>) return v ? 1 : 0;
  else return static_cast<A>(v);
}

template <class T, class A>
T store(A v) {
  if constexpr (std::is_same_v<T, bool>) return v != 0;
  else return T(v);
}

template <class A, class F>
void fold(A* acc, const A* tmp, std::size_t m, F f) {
  for (std::size_t i = 0; i < m; ++i) acc[i] = f(acc[i], tmp[i]);
}

template <class T>
void reduce_typed(reduce_op op, int divisor, const std::byte* const* srcs, int nsrc, std::byte* out, std::byte* out2,
                  std::size_t n) {
  using A = typename acc_of<T>::type;
  if constexpr (std::is_same_v<T, bool>) {
    if (op == reduce_op::sum || op == reduce_op::avg) op = reduce_op::max;
    if (op == reduce_op::product) op = reduce_op::min;
  }
  A acc[block];
  A tmp[block];
  for (std::size_t b = 0; b < n; b += block) {
    const std::size_t m = std::min(block, n - b);
    const T* s0 = reinterpret_cast<const T*>(srcs[0]) + b;
    for (std::size_t i = 0; i < m; ++i) acc[i] = load<T, A>(s0[i]);
    for (int k = 1; k < nsrc; ++k) {
      const T* sk = reinterpret_cast<const T*>(srcs[k]) + b;
      for (std::size_t i = 0; i < m; ++i) tmp[i] = load<T, A>(sk[i]);
      switch (op) {
        case reduce_op::sum: case reduce_op::avg: fold(acc, tmp, m, [](A x, A y) { return static_cast<A>(x + y); }); break;
        case reduce_op::product: fold(acc, tmp, m, [](A x, A y) { return static_cast<A>(x * y); }); break;
        case reduce_op::min: fold(acc, tmp, m, [](A x, A y) { return y < x ? y : x; }); break;
        case reduce_op::max: fold(acc, tmp, m, [](A x, A y) { return x < y ? y : x; }); break;
      }
    }
    if (op == reduce_op::avg && divisor > 1)
      for (std::size_t i = 0; i < m; ++i) acc[i] = static_cast<A>(acc[i] / static_cast<A>(divisor));
    T* o = reinterpret_cast<T*>(out) + b;
    for (std::size_t i = 0; i < m; ++i) o[i] = store<T, A>(acc[i]);
    if (out2 != nullptr) std::memcpy(reinterpret_cast<T*>(out2) + b, o, m * sizeof(T));
  }
}

/// o = the rank-ordered sum of 2-4 sources (divided by `div` when not 1), vectorisable.
template <class T>
void sum_sources(T* __restrict o, const T* const* s, int nsrc, T div, std::size_t n) {
  const T* __restrict a = s[0];
  const T* __restrict b = s[1];
  const T* __restrict c = nsrc > 2 ? s[2] : nullptr;
  const T* __restrict d = nsrc > 3 ? s[3] : nullptr;
  if (nsrc == 2) for (std::size_t i = 0; i < n; ++i) o[i] = a[i] + b[i];
  else if (nsrc == 3) for (std::size_t i = 0; i < n; ++i) o[i] = (a[i] + b[i]) + c[i];
  else for (std::size_t i = 0; i < n; ++i) o[i] = ((a[i] + b[i]) + c[i]) + d[i];
  if (div != T(1))
    for (std::size_t i = 0; i < n; ++i) o[i] = o[i] / div;
}

/// In place (out aliases a source, no out2): sums a block into an L1-resident buffer, then
/// stores it, so the vector loop never sees aliasing pointers.
template <class T>
void reduce_fast_in_place(T div, const std::byte* const* srcs, int nsrc, std::byte* out, std::size_t n) {
  constexpr std::size_t blk = 4096;
  alignas(64) T tmp[blk];
  const T* s[4];
  for (std::size_t b0 = 0; b0 < n; b0 += blk) {
    const std::size_t m = std::min(blk, n - b0);
    for (int k = 0; k < nsrc; ++k) s[k] = reinterpret_cast<const T*>(srcs[k]) + b0;
    sum_sources<T>(tmp, s, nsrc, div, m);
    std::memcpy(reinterpret_cast<T*>(out) + b0, tmp, m * sizeof(T));
  }
}

/// Fast path for float/double sum/avg: vectorisable, writes `out2` (never a source) first.
template <class T>
bool reduce_fast(reduce_op op, int divisor, const std::byte* const* srcs, int nsrc, std::byte* out, std::byte* out2,
                 std::size_t n) {
  if (nsrc < 2 || nsrc > 4 || (op != reduce_op::sum && op != reduce_op::avg)) return false;
  const T div = op == reduce_op::avg && divisor > 1 ? static_cast<T>(divisor) : T(1);
  if (out2 == nullptr) {
    reduce_fast_in_place<T>(div, srcs, nsrc, out, n);
    return true;
  }
  const T* s[4];
  for (int k = 0; k < nsrc; ++k) s[k] = reinterpret_cast<const T*>(srcs[k]);
  sum_sources<T>(reinterpret_cast<T*>(out2), s, nsrc, div, n);
  std::memcpy(out, out2, n * sizeof(T));
  return true;
}

}  // namespace

void reduce_arrays(troupe::dtype dt, reduce_op op, int divisor, const std::byte* const* srcs, int nsrc,
                   std::byte* out, std::byte* out2, std::size_t n) {
  if (dt == troupe::dtype::float32 && reduce_fast<float>(op, divisor, srcs, nsrc, out, out2, n)) return;
  if (dt == troupe::dtype::float64 && reduce_fast<double>(op, divisor, srcs, nsrc, out, out2, n)) return;
  visit_dtype(dt, [&](auto tag) { reduce_typed<decltype(tag)>(op, divisor, srcs, nsrc, out, out2, n); });
}

}  // namespace troupe::ddp::detail
