// Op layer: readable printing. Format (like PyTorch's repr, plus the metadata always shown):
//   tensor([[1.0000, 2.0000],
//           [3.0000, 4.0000]], dtype=float32, device=cpu, shape=[2, 2])
// Dims longer than 6 elements in tensors over 1000 elements show their first and last three
// entries around "...". Floats print with 4 decimals (scientific when large/small), integers
// exactly, bools as True/False.
#include <cmath>
#include <cstdio>

#include "op_util.hpp"

namespace troupe {

namespace {
constexpr std::int64_t summarize_over = 1000;
constexpr std::int64_t edge = 3;

std::string format_value(double v, dtype t) {
  if (t == dtype::boolean) return v != 0.0 ? "True" : "False";
  char buf[64];
  if (!is_floating(t)) {
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
  } else if (std::isnan(v) || std::isinf(v)) {
    return std::isnan(v) ? "nan" : (v > 0 ? "inf" : "-inf");
  } else {
    const double a = std::fabs(v);
    std::snprintf(buf, sizeof buf, (a != 0.0 && (a >= 1e8 || a < 1e-4)) ? "%.4e" : "%.4f", v);
  }
  return buf;
}

struct printer {
  const tensor& t;  // contiguous host copy
  bool summarize;
  std::string out;

  double at(std::int64_t flat) const {
    return visit_dtype(t.dtype(), [&](auto tag) {
      using T = decltype(tag);
      return to_double(static_cast<const T*>(t.data_ptr())[flat]);
    });
  }

  void rec(std::size_t d, std::int64_t base, int indent) {
    const auto& sz = t.sizes();
    const std::int64_t n = sz[d], stride = t.strides()[d];
    out += "[";
    for (std::int64_t i = 0; i < n; ++i) {
      if (summarize && n > 2 * edge && i == edge) {
        out += d + 1 == sz.size() ? "..., " : "...,\n" + std::string(static_cast<std::size_t>(indent + 1), ' ');
        i = n - edge;
      }
      if (d + 1 == sz.size()) out += format_value(at(base + i * stride), t.dtype());
      else rec(d + 1, base + i * stride, indent + 1);
      if (i + 1 < n) out += d + 1 == sz.size() ? ", " : ",\n" + std::string(static_cast<std::size_t>(indent + 1), ' ');
    }
    out += "]";
  }
};
}  // namespace

std::string tensor::to_string() const {
  if (!defined()) return "tensor(undefined)";
  const tensor host = (is_cpu() ? *this : cpu()).contiguous();
  printer p{host, numel() > summarize_over, {}};
  if (dim() == 0) p.out = format_value(p.at(0), dtype());
  else p.rec(0, 0, 7);
  return "tensor(" + p.out + ", dtype=" + std::string(troupe::to_string(dtype())) + ", device=" +
         troupe::to_string(device()) + ", shape=" + shape_to_string(shape()) + ")";
}

}  // namespace troupe
