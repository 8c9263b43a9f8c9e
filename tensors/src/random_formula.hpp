#pragma once
// Private: the one formula both backends use to turn Philox output into random tensor elements,
// so the same generator state gives bit-identical tensors on CPU and CUDA.
//
// Note [Random formula]
// ---------------------
// A draw of numel elements reserves ceil(numel / 4) Philox blocks: `offset = gen.reserve(...)`.
// Element i (in contiguous row-major order of the output) reads
//     w(i) = philox4x32(seed, offset + i / 4)[i % 4]                     (32-bit word)
// uniform(low, high), every floating dtype:
//     u(i) = (w(i) >> 8) * 2^-24                                          in [0, 1), 24 bits
//     x(i) = low + (high - low) * u(i)      computed in double, then rounded once to the dtype
// normal(mean, std), Box–Muller on pairs p = i / 2 (elements 2p and 2p+1 share a pair):
//     u1 = ((w(2p) >> 8) + 1) * 2^-24                                      in (0, 1]
//     u2 =  (w(2p+1) >> 8) * 2^-24                                         in [0, 1)
//     r = sqrt(-2 ln u1), t = 2 pi u2; z(2p) = r cos t, z(2p+1) = r sin t  (in double)
//     x(i) = mean + std * z(i), rounded once to the dtype
//   (for odd numel the last element uses the words of pair p as if 2p+1 existed: word 2p+1
//   lies in the same reserved block, so no extra block is needed)
// randint(low, high), range = high - low (>= 1):
//     x(i) = low + ((uint64(w(i)) * range) >> 32)     (multiply-shift, no division; for ranges
//   above 2^32 only 2^32 distinct values are reachable: documented limitation)
// Everything is double arithmetic on the host and on the device. So results agree to the last
// bit where libm and CUDA's sqrt/log/sincos agree; both are correctly rounded or within 1 ulp.
// Normals may differ in the last bit of float64, never after rounding to float32 in practice.

#include <cmath>
#include <cstdint>

#include "troupe/tensors/generator.hpp"

#if defined(__CUDACC__)
#define TROUPE_HOST_DEVICE __host__ __device__
#else
#define TROUPE_HOST_DEVICE
#endif

namespace troupe::random_formula {

/// The 32-bit word w(i) of Note [Random formula].
TROUPE_HOST_DEVICE inline std::uint32_t word_at(std::uint64_t seed, std::uint64_t offset, std::uint64_t i) {
  return philox4x32(seed, offset + i / 4)[i % 4];
}

/// 24-bit uniform in [0, 1) from a word.
TROUPE_HOST_DEVICE inline double unit_from_word(std::uint32_t w) { return static_cast<double>(w >> 8) * (1.0 / 16777216.0); }

/// Element i of uniform(low, high).
TROUPE_HOST_DEVICE inline double uniform_at(std::uint64_t seed, std::uint64_t offset, std::uint64_t i, double low,
                                            double high) {
  return low + (high - low) * unit_from_word(word_at(seed, offset, i));
}

/// Element i of normal(mean, std).
TROUPE_HOST_DEVICE inline double normal_at(std::uint64_t seed, std::uint64_t offset, std::uint64_t i, double mean,
                                           double std) {
  const std::uint64_t first = (i / 2) * 2;
  const auto words = philox4x32(seed, offset + first / 4);
  const double u1 = (static_cast<double>(words[first % 4] >> 8) + 1.0) * (1.0 / 16777216.0);
  const double u2 = unit_from_word(words[first % 4 + 1]);
  const double r = std::sqrt(-2.0 * std::log(u1));
  const double t = 6.283185307179586476925286766559 * u2;
  return mean + std * ((i % 2 == 0) ? r * std::cos(t) : r * std::sin(t));
}

/// Element i of randint(low, high); requires high > low.
TROUPE_HOST_DEVICE inline std::int64_t randint_at(std::uint64_t seed, std::uint64_t offset, std::uint64_t i,
                                                  std::int64_t low, std::int64_t high) {
  const std::uint64_t range = static_cast<std::uint64_t>(high - low);
  const std::uint64_t w = word_at(seed, offset, i);
  return low + static_cast<std::int64_t>((w * range) >> 32);
}

/// Philox blocks one draw of `numel` elements reserves.
TROUPE_HOST_DEVICE inline std::uint64_t blocks_for(std::uint64_t numel) { return (numel + 3) / 4; }

}  // namespace troupe::random_formula
