// Shape arithmetic: element and byte counts, contiguous strides, broadcasting.
#include "troupe/tensors/shape.hpp"

#include <algorithm>
#include <limits>

#include "troupe/tensors/error.hpp"

namespace troupe {

std::string shape_to_string(const shape_t& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}

shape_t contiguous_strides(const shape_t& sizes) {
  shape_t st(sizes.size());
  std::int64_t acc = 1;
  for (std::size_t i = sizes.size(); i-- > 0;) {
    st[i] = acc;
    // Saturates: only a shape with a zero extent (no elements) can overflow here, and its
    // strides are never used to address memory.
    if (__builtin_mul_overflow(acc, std::max<std::int64_t>(sizes[i], 1), &acc)) acc = std::numeric_limits<std::int64_t>::max();
  }
  return st;
}

std::int64_t numel_of(const shape_t& sizes) {
  // The product of the non-zero sizes must fit too: contiguous strides are built from it.
  std::int64_t n = 1;
  bool bad = false, zero = false;
  for (auto s : sizes) {
    bad |= s < 0 || __builtin_mul_overflow(n, s > 1 ? s : 1, &n);
    zero |= s == 0;
  }
  if (bad) throw error(errc::bad_argument, "shape " + shape_to_string(sizes) + " has a negative size or more than 2^63 elements");
  return zero ? 0 : n;
}

std::int64_t nbytes_of(const shape_t& sizes, dtype dt) {
  std::int64_t bytes = 0;
  if (__builtin_mul_overflow(numel_of(sizes), static_cast<std::int64_t>(element_size(dt)), &bytes))
    throw error(errc::bad_argument, "shape " + shape_to_string(sizes) + " of " + std::string(to_string(dt)) + " has more than 2^63 bytes");
  return bytes;
}

shape_t broadcast_shapes(const shape_t& a, const shape_t& b, const char* op) {
  const std::size_t n = std::max(a.size(), b.size());
  shape_t out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (da != db && da != 1 && db != 1)
      throw error(errc::shape_mismatch, std::string(op) + ": shapes " + shape_to_string(a) + " and " +
                                            shape_to_string(b) + " do not broadcast (dim " +
                                            std::to_string(i) + ": " + std::to_string(da) + " vs " +
                                            std::to_string(db) + ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

}  // namespace troupe
