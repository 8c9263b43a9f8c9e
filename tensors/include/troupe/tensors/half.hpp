#pragma once
/// \file half.hpp
/// The 16-bit float storage types: IEEE binary16 (`half`) and bfloat16 (`bfloat16`).
/// Conversions from float round to nearest, ties to even; NaN stays NaN, overflow goes to ±Inf.

#include <bit>
#include <cstdint>
#include <cstring>

namespace troupe {

/// IEEE 754 binary16, stored as its bit pattern.
struct half {
  std::uint16_t bits = 0;

  half() = default;
  explicit half(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static half from_bits(std::uint16_t b) { half h; h.bits = b; return h; }

  /// float -> binary16, round to nearest even.
  static constexpr std::uint16_t from_float(float f) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    const std::uint32_t sign = (x >> 16) & 0x8000u;
    const std::uint32_t abs = x & 0x7fffffffu;
    if (abs >= 0x7f800000u) {  // Inf or NaN
      return static_cast<std::uint16_t>(sign | (abs > 0x7f800000u ? 0x7e00u : 0x7c00u));
    }
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to Inf
    if (abs < 0x38800000u) {  // result is subnormal or zero
      if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below half the smallest
      const std::uint32_t exp = abs >> 23;
      const std::uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
      // value = mant * 2^(exp-150); subnormal half unit = 2^-24 -> result = mant * 2^(exp-126)
      const std::uint32_t s = 126u - exp;  // right shift amount, in [14, 24]
      std::uint32_t q = mant >> s;
      const std::uint32_t rem = mant & ((1u << s) - 1u);
      const std::uint32_t halfway = 1u << (s - 1u);
      if (rem > halfway || (rem == halfway && (q & 1u))) ++q;
      return static_cast<std::uint16_t>(sign | q);
    }
    // normal: rebias exponent 127 -> 15, keep 10 mantissa bits, round to nearest even
    std::uint32_t v = abs - 0x38000000u;  // exponent - 112
    const std::uint32_t rem = v & 0x1fffu;
    v >>= 13;
    if (rem > 0x1000u || (rem == 0x1000u && (v & 1u))) ++v;  // may carry into exponent: fine
    return static_cast<std::uint16_t>(sign | v);
  }

  /// binary16 -> float, exact.
  static constexpr float to_float(std::uint16_t h) {
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exp = (h >> 10) & 0x1fu;
    std::uint32_t mant = h & 0x3ffu;
    std::uint32_t out;
    if (exp == 0x1fu) {
      out = sign | 0x7f800000u | (mant << 13);
    } else if (exp != 0) {
      out = sign | ((exp + 112u) << 23) | (mant << 13);
    } else if (mant == 0) {
      out = sign;
    } else {  // subnormal: normalise
      std::uint32_t e = 113u;
      while ((mant & 0x400u) == 0) { mant <<= 1; --e; }
      out = sign | (e << 23) | ((mant & 0x3ffu) << 13);
    }
    return std::bit_cast<float>(out);
  }
};

/// bfloat16: the top 16 bits of a float32, rounded to nearest even.
struct bfloat16 {
  std::uint16_t bits = 0;

  bfloat16() = default;
  explicit bfloat16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static bfloat16 from_bits(std::uint16_t b) { bfloat16 h; h.bits = b; return h; }

  static constexpr std::uint16_t from_float(float f) {
    const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);  // quiet NaN
    const std::uint32_t lsb = (x >> 16) & 1u;
    return static_cast<std::uint16_t>((x + 0x7fffu + lsb) >> 16);
  }
  static constexpr float to_float(std::uint16_t b) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
  }
};

}  // namespace troupe
