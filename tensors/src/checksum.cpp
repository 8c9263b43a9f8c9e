// XXH64, written from the published algorithm description: four lanes of
// acc = rotl(acc + lane * P2, 31) * P1 over 32-byte stripes, a merge, the tail, an avalanche.
#include "checksum.hpp"

#include <bit>
#include <cstring>

namespace troupe::detail {

namespace {

constexpr std::uint64_t p1 = 0x9E3779B185EBCA87ull;
constexpr std::uint64_t p2 = 0xC2B2AE3D27D4EB4Full;
constexpr std::uint64_t p3 = 0x165667B19E3779F9ull;
constexpr std::uint64_t p4 = 0x85EBCA77C2B2AE63ull;
constexpr std::uint64_t p5 = 0x27D4EB2F165667C5ull;

static_assert(std::endian::native == std::endian::little, "checksum64 reads little-endian words");

inline std::uint64_t read64(const unsigned char* p) noexcept {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
inline std::uint32_t read32(const unsigned char* p) noexcept {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline std::uint64_t round(std::uint64_t acc, std::uint64_t lane) noexcept {
  return std::rotl(acc + lane * p2, 31) * p1;
}
inline std::uint64_t merge(std::uint64_t acc, std::uint64_t lane) noexcept {
  return (acc ^ round(0, lane)) * p1 + p4;
}

}  // namespace

std::uint64_t checksum64(const void* data, std::size_t n, std::uint64_t seed) noexcept {
  // Counts, not end pointers: `data` may be null when n is 0 (an empty tensor).
  const auto* p = static_cast<const unsigned char*>(data);
  std::size_t left = n;
  std::uint64_t h;
  if (left >= 32) {
    std::uint64_t v1 = seed + p1 + p2, v2 = seed + p2, v3 = seed, v4 = seed - p1;
    do {
      v1 = round(v1, read64(p));
      v2 = round(v2, read64(p + 8));
      v3 = round(v3, read64(p + 16));
      v4 = round(v4, read64(p + 24));
      p += 32;
      left -= 32;
    } while (left >= 32);
    h = std::rotl(v1, 1) + std::rotl(v2, 7) + std::rotl(v3, 12) + std::rotl(v4, 18);
    h = merge(merge(merge(merge(h, v1), v2), v3), v4);
  } else {
    h = seed + p5;
  }
  h += static_cast<std::uint64_t>(n);
  for (; left >= 8; p += 8, left -= 8) h = std::rotl(h ^ round(0, read64(p)), 27) * p1 + p4;
  if (left >= 4) {
    h = std::rotl(h ^ (static_cast<std::uint64_t>(read32(p)) * p1), 23) * p2 + p3;
    p += 4;
    left -= 4;
  }
  for (; left > 0; ++p, --left) h = std::rotl(h ^ (static_cast<std::uint64_t>(*p) * p5), 11) * p1;
  h ^= h >> 33;
  h *= p2;
  h ^= h >> 29;
  h *= p3;
  h ^= h >> 32;
  return h;
}

}  // namespace troupe::detail
