// Finite-difference gradient checking against the engine's analytic gradients.
#include "troupe/autograd/gradcheck.hpp"

#include <cmath>
#include <cstdio>

#include "troupe/autograd/engine.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe {

namespace {

// Row-major multi-index of element `linear` of `shape`.
shape_t unravel(std::int64_t linear, const shape_t& shape) {
  shape_t idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = shape[d] == 0 ? 0 : linear % shape[d];
    linear = shape[d] == 0 ? 0 : linear / shape[d];
  }
  return idx;
}

// Address of logical element `linear` of a CPU float64 tensor (any strides).
double* element(const tensor& t, std::int64_t linear) {
  const shape_t idx = unravel(linear, t.shape());
  std::int64_t off = 0;
  for (std::size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.strides()[d];
  return t.data<double>() + off;
}

// The values of `t` as doubles, in row-major order.
std::vector<double> values_of(const tensor& t) {
  no_grad_guard ng;
  const tensor c = t.to(dtype::float64).contiguous();
  const double* p = c.data<double>();
  return std::vector<double>(p, p + c.numel());
}

// A fixed, non-uniform grad_output, so that a formula summing where it should not shows up.
tensor probe_like(const tensor& y) {
  std::vector<double> v(static_cast<std::size_t>(y.numel()));
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = 0.5 + static_cast<double>((k * 37 + 3) % 11) / 10.0;
  return from_vector<double>(v, y.shape()).to(y.dtype());
}

double dot(const tensor& y, const std::vector<double>& v) {
  const auto yv = values_of(y);
  double acc = 0;
  for (std::size_t k = 0; k < yv.size(); ++k) acc += yv[k] * v[k];
  return acc;
}

void check_inputs(const tensor_list& inputs, std::vector<std::size_t>& diff) {
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const tensor& t = inputs[i];
    if (!t.defined() || !t.requires_grad()) continue;
    if (t.dtype() != dtype::float64 || !t.is_cpu())
      throw error(errc::bad_argument, "gradcheck: input " + std::to_string(i) + " requires grad but is " +
                                          std::string(to_string(t.dtype())) + " on " + to_string(t.device()) +
                                          "; use float64 CPU inputs");
    diff.push_back(i);
  }
  if (diff.empty()) throw error(errc::bad_argument, "gradcheck: no input requires grad");
}

std::string fmt(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

}  // namespace

bool gradcheck(std::function<tensor(const tensor_list&)> f, tensor_list inputs, double eps, double atol, double rtol) {
  std::vector<std::size_t> diff;
  check_inputs(inputs, diff);
  tensor y;
  {
    enable_grad_guard eg;
    y = f(inputs);
  }
  if (!y.defined() || !y.requires_grad())
    throw error(errc::autograd_error, "gradcheck: the output does not require grad (no op recorded a graph)");
  const tensor v = probe_like(y);
  const auto vv = values_of(v);
  tensor_list wrt;
  for (auto i : diff) wrt.push_back(inputs[i]);
  const tensor_list analytic = engine().grad({y}, wrt, {v});
  for (std::size_t k = 0; k < diff.size(); ++k) {
    const tensor& x = inputs[diff[k]];
    const auto a = analytic[k].defined() ? values_of(analytic[k]) : std::vector<double>(static_cast<std::size_t>(x.numel()), 0.0);
    for (std::int64_t j = 0; j < x.numel(); ++j) {
      double* p = element(x, j);
      const double orig = *p;
      double plus = 0, minus = 0;
      {
        no_grad_guard ng;
        *p = orig + eps;
        plus = dot(f(inputs), vv);
        *p = orig - eps;
        minus = dot(f(inputs), vv);
        *p = orig;
      }
      const double numeric = (plus - minus) / (2 * eps);
      const double an = a[static_cast<std::size_t>(j)];
      if (!(std::abs(numeric - an) <= atol + rtol * std::abs(numeric)))
        throw error(errc::autograd_error, "gradcheck: mismatch for input " + std::to_string(diff[k]) + " (shape " +
                                              shape_to_string(x.shape()) + ") at element " +
                                              shape_to_string(unravel(j, x.shape())) + ": numeric " + fmt(numeric) +
                                              " vs analytic " + fmt(an));
    }
  }
  return true;
}

}  // namespace troupe
