#pragma once
/// \file dtype.hpp
/// Element types of tensors, their sizes and names, type promotion, and a compile-time visitor.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "troupe/tensors/half.hpp"

namespace troupe {

/// Element type of a tensor. Values are part of the file and wire formats: append, never reorder.
enum class dtype : std::uint8_t {
  float32 = 0,
  float64 = 1,
  float16 = 2,
  bfloat16 = 3,
  int32 = 4,
  int64 = 5,
  uint8 = 6,
  boolean = 7,
};

inline constexpr int num_dtypes = 8;

/// Size of one element in bytes.
constexpr std::size_t element_size(dtype t) noexcept {
  switch (t) {
    case dtype::float64: case dtype::int64: return 8;
    case dtype::float32: case dtype::int32: return 4;
    case dtype::float16: case dtype::bfloat16: return 2;
    case dtype::uint8: case dtype::boolean: return 1;
  }
  return 0;
}

/// The dtype's name as PyTorch spells it ("float32", "bool").
std::string_view to_string(dtype t) noexcept;
/// Parses a name written by to_string; throws troupe::error(bad_argument) otherwise.
dtype dtype_from_string(std::string_view name);

constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::float32 || t == dtype::float64 || t == dtype::float16 || t == dtype::bfloat16;
}
constexpr bool is_integral(dtype t, bool include_bool = false) noexcept {
  return t == dtype::int32 || t == dtype::int64 || t == dtype::uint8 ||
         (include_bool && t == dtype::boolean);
}

/// Result dtype of a binary op between two tensors (PyTorch's promotion lattice:
/// bool < uint8 < int32 < int64 < float16/bfloat16 < float32 < float64;
/// float16 with bfloat16 gives float32).
dtype promote_types(dtype a, dtype b) noexcept;

/// C++ type of each dtype.
template <dtype T> struct dtype_traits;
template <> struct dtype_traits<dtype::float32> { using type = float; };
template <> struct dtype_traits<dtype::float64> { using type = double; };
template <> struct dtype_traits<dtype::float16> { using type = half; };
template <> struct dtype_traits<dtype::bfloat16> { using type = bfloat16; };
template <> struct dtype_traits<dtype::int32> { using type = std::int32_t; };
template <> struct dtype_traits<dtype::int64> { using type = std::int64_t; };
template <> struct dtype_traits<dtype::uint8> { using type = std::uint8_t; };
template <> struct dtype_traits<dtype::boolean> { using type = bool; };
template <dtype T> using dtype_t = typename dtype_traits<T>::type;

/// The dtype of a C++ type.
template <class T> constexpr dtype dtype_of();
template <> constexpr dtype dtype_of<float>() { return dtype::float32; }
template <> constexpr dtype dtype_of<double>() { return dtype::float64; }
template <> constexpr dtype dtype_of<half>() { return dtype::float16; }
template <> constexpr dtype dtype_of<bfloat16>() { return dtype::bfloat16; }
template <> constexpr dtype dtype_of<std::int32_t>() { return dtype::int32; }
template <> constexpr dtype dtype_of<std::int64_t>() { return dtype::int64; }
template <> constexpr dtype dtype_of<std::uint8_t>() { return dtype::uint8; }
template <> constexpr dtype dtype_of<bool>() { return dtype::boolean; }

/// Calls `f(T{})` with a value of the C++ type of `t` (a tag; only its type matters).
/// Usage: visit_dtype(t, [&](auto tag) { using T = decltype(tag); ... });
template <class F>
decltype(auto) visit_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::float32: return f(float{});
    case dtype::float64: return f(double{});
    case dtype::float16: return f(half{});
    case dtype::bfloat16: return f(bfloat16{});
    case dtype::int32: return f(std::int32_t{});
    case dtype::int64: return f(std::int64_t{});
    case dtype::uint8: return f(std::uint8_t{});
    case dtype::boolean: return f(bool{});
  }
  return f(float{});
}

/// Converts any element type to double (exact for all but int64 beyond 2^53).
template <class T> constexpr double to_double(T v) noexcept {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return static_cast<double>(static_cast<float>(v));
  else return static_cast<double>(v);
}
/// Converts a double to an element type (16-bit floats via float, rounding to nearest even).
template <class T> constexpr T from_double(double v) noexcept {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return T(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>) return v != 0.0;
  else return static_cast<T>(v);
}

}  // namespace troupe
