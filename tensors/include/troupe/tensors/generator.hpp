#pragma once
/// \file generator.hpp
/// A counter-based random generator (Philox-4x32-10). Element i of a draw is a pure function of
/// (seed, offset + i), so the same seed gives the same tensor on every rank and every device.
/// A generator is a value: pass it explicitly; there is no global generator.

#include <array>
#include <cstdint>

namespace troupe {

/// Philox-4x32-10 state: a seed and a counter offset (in 128-bit blocks).
class generator {
 public:
  explicit generator(std::uint64_t seed = 0) : seed_(seed) {}

  std::uint64_t seed() const noexcept { return seed_; }
  std::uint64_t offset() const noexcept { return offset_; }
  void set_offset(std::uint64_t o) noexcept { offset_ = o; }
  void manual_seed(std::uint64_t s) noexcept { seed_ = s; offset_ = 0; }

  /// Reserves `n` 128-bit counter blocks and returns the first (for kernels that need them).
  std::uint64_t reserve(std::uint64_t n) noexcept { const auto o = offset_; offset_ += n; return o; }

  friend bool operator==(const generator&, const generator&) = default;

 private:
  std::uint64_t seed_ = 0;
  std::uint64_t offset_ = 0;
};

/// The Philox-4x32-10 block function: four 32-bit random words for counter `ctr` under `key`.
/// Usable from host and device code.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline std::array<std::uint32_t, 4> philox4x32(std::uint64_t key, std::uint64_t ctr_lo, std::uint64_t ctr_hi = 0) {
  std::uint32_t c0 = static_cast<std::uint32_t>(ctr_lo), c1 = static_cast<std::uint32_t>(ctr_lo >> 32);
  std::uint32_t c2 = static_cast<std::uint32_t>(ctr_hi), c3 = static_cast<std::uint32_t>(ctr_hi >> 32);
  std::uint32_t k0 = static_cast<std::uint32_t>(key), k1 = static_cast<std::uint32_t>(key >> 32);
  for (int r = 0; r < 10; ++r) {
    const std::uint64_t p0 = static_cast<std::uint64_t>(0xD2511F53u) * c0;
    const std::uint64_t p1 = static_cast<std::uint64_t>(0xCD9E8D57u) * c2;
    const std::uint32_t n0 = static_cast<std::uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const std::uint32_t n2 = static_cast<std::uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<std::uint32_t>(p1);
    c3 = static_cast<std::uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {c0, c1, c2, c3};
}

}  // namespace troupe
