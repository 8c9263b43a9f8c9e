#include "troupe/tensors/dtype.hpp"

#include <string>

#include "troupe/tensors/device.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe {

std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return "float32";
    case dtype::float64: return "float64";
    case dtype::float16: return "float16";
    case dtype::bfloat16: return "bfloat16";
    case dtype::int32: return "int32";
    case dtype::int64: return "int64";
    case dtype::uint8: return "uint8";
    case dtype::boolean: return "bool";
  }
  return "unknown";
}

dtype dtype_from_string(std::string_view name) {
  for (int i = 0; i < num_dtypes; ++i) {
    const auto t = static_cast<dtype>(i);
    if (to_string(t) == name) return t;
  }
  throw error(errc::bad_argument, "unknown dtype name '" + std::string(name) + "'");
}

namespace {
// Rank in the promotion lattice; float16 and bfloat16 share a rank (they promote to float32).
int promotion_rank(dtype t) noexcept {
  switch (t) {
    case dtype::boolean: return 0;
    case dtype::uint8: return 1;
    case dtype::int32: return 2;
    case dtype::int64: return 3;
    case dtype::float16: case dtype::bfloat16: return 4;
    case dtype::float32: return 5;
    case dtype::float64: return 6;
  }
  return 0;
}
}  // namespace

dtype promote_types(dtype a, dtype b) noexcept {
  if (a == b) return a;
  if ((a == dtype::float16 && b == dtype::bfloat16) || (a == dtype::bfloat16 && b == dtype::float16))
    return dtype::float32;
  return promotion_rank(a) >= promotion_rank(b) ? a : b;
}

device::device(std::string_view spec) {
  if (spec == "cpu") { type = device_type::cpu; index = 0; return; }
  if (spec == "cuda") { type = device_type::cuda; index = 0; return; }
  if (spec.starts_with("cuda:") && spec.size() > 5) {
    int v = 0;
    for (char c : spec.substr(5)) {
      if (c < '0' || c > '9' || v > 1000) throw error(errc::bad_argument, "bad device '" + std::string(spec) + "'");
      v = v * 10 + (c - '0');
    }
    type = device_type::cuda;
    index = static_cast<std::int16_t>(v);
    return;
  }
  throw error(errc::bad_argument, "bad device '" + std::string(spec) + "' (expected cpu, cuda or cuda:N)");
}

std::string to_string(device d) {
  return d.is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(d.index);
}

}  // namespace troupe
