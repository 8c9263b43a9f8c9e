#pragma once
/// \file device.hpp
/// Where a tensor's storage lives: the host (`cpu`) or a CUDA device (`cuda:N`).

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace troupe {

enum class device_type : std::uint8_t { cpu = 0, cuda = 1 };

/// A device: its type and, for CUDA, its ordinal.
struct device {
  device_type type = device_type::cpu;
  std::int16_t index = 0;

  constexpr device() = default;
  constexpr device(device_type t, int i = 0) : type(t), index(static_cast<std::int16_t>(i)) {}
  /// Parses "cpu", "cuda", "cuda:N"; throws troupe::error(bad_argument) otherwise.
  explicit device(std::string_view spec);

  constexpr bool is_cpu() const noexcept { return type == device_type::cpu; }
  constexpr bool is_cuda() const noexcept { return type == device_type::cuda; }
  friend constexpr bool operator==(device, device) = default;
};

/// "cpu" or "cuda:N".
std::string to_string(device d);

inline constexpr device cpu_device{};
/// The CUDA device with ordinal `index`.
constexpr device cuda_device(int index = 0) { return device{device_type::cuda, index}; }

}  // namespace troupe
