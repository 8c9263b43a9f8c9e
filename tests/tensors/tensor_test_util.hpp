#pragma once
// Test helpers for the tensors layer: an independent float64 reader (plain loops over
// strides, no library kernels), input generators in several layouts, and per-dtype
// tolerances.

#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe::test {

/// Row-major walk over an index space.
inline void for_each_idx(const shape_t& sizes, const std::function<void(const shape_t&)>& f) {
  if (numel_of(sizes) == 0) return;
  shape_t idx(sizes.size(), 0);
  while (true) {
    f(idx);
    std::size_t d = sizes.size();
    for (;;) {
      if (d == 0) return;
      --d;
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
  }
}

/// Element at `idx` as double, read through the tensor's own strides.
inline double read_at(const tensor& t, const shape_t& idx) {
  std::int64_t off = 0;
  for (std::size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.strides()[d];
  return visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    return to_double(static_cast<const T*>(t.data_ptr())[off]);
  });
}

/// All elements in row-major order, as doubles.
inline std::vector<double> values(const tensor& t) {
  std::vector<double> v;
  for_each_idx(t.shape(), [&](const shape_t& i) { v.push_back(read_at(t, i)); });
  return v;
}

/// The value of the broadcast input `in` (shape `s`) at output index `out_idx`.
inline double broadcast_read(const tensor& in, const shape_t& out_idx) {
  shape_t idx(static_cast<std::size_t>(in.dim()));
  const std::size_t lead = out_idx.size() - idx.size();
  for (std::size_t d = 0; d < idx.size(); ++d) idx[d] = in.shape()[d] == 1 ? 0 : out_idx[d + lead];
  return read_at(in, idx);
}

/// Deterministic test value k for dtype t: small, exactly representable in every float dtype;
/// strictly positive when `positive`.
inline double test_value(std::int64_t k, dtype t, bool positive = false) {
  const std::int64_t r = (k * 37 + 11) % 19;
  if (t == dtype::boolean) return r % 2 == 0 ? 1.0 : 0.0;
  if (t == dtype::uint8) return static_cast<double>(r);
  if (!is_floating(t)) return positive ? static_cast<double>(r + 1) : static_cast<double>(r - 9);
  return positive ? static_cast<double>(r + 1) / 8.0 : static_cast<double>(r - 9) / 4.0;
}

/// Writes test values into a contiguous tensor.
inline void fill_test_values(const tensor& t, std::int64_t seed, bool positive) {
  visit_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(t.data_ptr());
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] = from_double<T>(test_value(i + seed, t.dtype(), positive));
  });
}

enum class layout { contiguous, transposed, strided, expanded };

inline std::string to_string(layout l) {
  switch (l) {
    case layout::contiguous: return "contiguous";
    case layout::transposed: return "transposed";
    case layout::strided: return "strided";
    case layout::expanded: return "expanded";
  }
  return "?";
}

/// A tensor of `shape` and dtype `t` with test values, in the given memory layout:
/// - transposed: a permuted view of reversed-shape storage;
/// - strided: every second element of the last dim;
/// - expanded: dim 0 broadcast from size 1 (0-stride).
inline tensor make_input(const shape_t& shape, dtype t, layout l, std::int64_t seed = 0, bool positive = false) {
  if (shape.empty() || l == layout::contiguous) {
    tensor x = empty(shape, t);
    fill_test_values(x, seed, positive);
    return x;
  }
  switch (l) {
    case layout::transposed: {
      shape_t rev(shape.rbegin(), shape.rend()), perm;
      for (std::int64_t d = static_cast<std::int64_t>(shape.size()) - 1; d >= 0; --d) perm.push_back(d);
      tensor x = empty(rev, t);
      fill_test_values(x, seed, positive);
      return x.permute(perm);
    }
    case layout::strided: {
      shape_t big = shape;
      big.back() = big.back() * 2;
      tensor x = empty(big, t);
      fill_test_values(x, seed, positive);
      return x.slice(-1, 0, big.back(), 2);
    }
    default: {
      shape_t one = shape;
      one[0] = 1;
      tensor x = empty(one, t);
      fill_test_values(x, seed, positive);
      return x.expand(shape);
    }
  }
}

/// Absolute+relative tolerance for results computed in dtype t.
inline double tolerance(dtype t) {
  switch (t) {
    case dtype::float64: return 1e-12;
    case dtype::float32: return 1e-5;
    case dtype::float16: return 2e-3;
    case dtype::bfloat16: return 1.6e-2;
    default: return 0.0;
  }
}

/// Rounds a reference value the way storing it in dtype t does.
inline double round_to(double v, dtype t) {
  return visit_dtype(t, [&](auto tag) { return to_double(from_double<decltype(tag)>(v)); });
}

/// True if got ≈ want under the tolerance of t (NaNs equal, infinities exact).
inline bool close(double got, double want, dtype t, double scale = 1.0) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  const double tol = tolerance(t) * scale;
  return std::fabs(got - want) <= tol * (1.0 + std::fabs(want));
}

/// Checks every element of `got` against `ref(idx)`, reporting the first mismatch.
inline void check_all(const tensor& got, const std::function<double(const shape_t&)>& ref, double scale = 1.0) {
  bool ok = true;
  std::string where;
  auto check = [&](const shape_t& idx) {
    if (!ok) return;
    const double g = read_at(got, idx), w = ref(idx);
    if (!close(g, w, got.dtype(), scale)) {
      ok = false;
      where = "at " + shape_to_string(idx) + ": got " + std::to_string(g) + " want " + std::to_string(w);
    }
  };
  for_each_idx(got.shape(), check);
  INFO(where);
  CHECK(ok);
}

inline const std::vector<dtype>& all_dtypes() {
  static const std::vector<dtype> v{dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16,
                                    dtype::int32,   dtype::int64,   dtype::uint8,   dtype::boolean};
  return v;
}

}  // namespace troupe::test
