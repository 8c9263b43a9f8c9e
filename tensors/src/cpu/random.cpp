// CPU kernels: uniform, normal and randint from Philox-4x32-10.
//
// The formula (shared with CUDA through random_formula.hpp; see Note [Random formula]):
//   element i of out (contiguous row-major order) uses word i % 4 of block (offset + i / 4);
//   uniform: u = (w >> 8) * 2^-24 in [0, 1) for every float dtype, x = low + (high-low)*u in
//            double, rounded once to the dtype;
//   normal:  Box–Muller on pairs (2p, 2p+1): u1 = ((w(2p) >> 8) + 1) * 2^-24,
//            u2 = (w(2p+1) >> 8) * 2^-24, z = sqrt(-2 ln u1) * (cos | sin)(2 pi u2);
//   randint: low + ((uint64(w) * (high - low)) >> 32).
// The op layer reserves ceil(numel / 4) blocks per draw, so successive draws differ.
#include "../kernels.hpp"
#include "../random_formula.hpp"
#include "loops.hpp"

namespace troupe::kernels::cpu {

namespace {
using namespace detail;

// Calls store(o + i, f(i)) in contiguous order of `out` for an arbitrary-strided `out`.
template <class T, class F>
void generate(const tensor& out, F&& f) {
  T* base = static_cast<T*>(out.data_ptr());
  if (out.is_contiguous()) {
    const std::int64_t n = out.numel();
    for (std::int64_t i = 0; i < n; ++i) store(base + i, f(static_cast<std::uint64_t>(i)));
    return;
  }
  std::uint64_t i = 0;
  for_each_index(out.sizes(), [&](const shape_t& at) { store(base + offset_of(at, out.strides()), f(i++)); });
}
}  // namespace

void uniform(const tensor& out, std::uint64_t seed, std::uint64_t offset, double low, double high) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    generate<T>(out, [&](std::uint64_t i) { return random_formula::uniform_at(seed, offset, i, low, high); });
  });
}

void normal(const tensor& out, std::uint64_t seed, std::uint64_t offset, double mean, double std) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    generate<T>(out, [&](std::uint64_t i) { return random_formula::normal_at(seed, offset, i, mean, std); });
  });
}

void randint(const tensor& out, std::uint64_t seed, std::uint64_t offset, std::int64_t low, std::int64_t high) {
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    generate<T>(out, [&](std::uint64_t i) {
      return random_formula::randint_at(seed, offset, i, low, high);
    });
  });
}

}  // namespace troupe::kernels::cpu
