#pragma once
// Private: the 64-bit checksum of Troupe's tensor files (the XXH64 algorithm, implemented here).
// Runs over every checkpoint byte, so it is built for speed: four independent 64-bit lanes.

#include <cstddef>
#include <cstdint>

namespace troupe::detail {

/// XXH64 of `n` bytes at `data` with `seed`. Pure function; thread-safe.
std::uint64_t checksum64(const void* data, std::size_t n, std::uint64_t seed = 0) noexcept;

}  // namespace troupe::detail
