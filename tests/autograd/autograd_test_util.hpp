#pragma once
// Helpers shared by the autograd tests (h4a's): float64 leaves, value extraction, custom nodes.

#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/autograd/autograd_meta.hpp"
#include "troupe/autograd/gradcheck.hpp"
#include "troupe/autograd/grad_node.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::test {

/// A float64 leaf requiring grad, uniform in [lo, hi) from a seeded generator.
inline tensor leaf(shape_t shape, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  generator g(seed);
  tensor t = rand(std::move(shape), g, dtype::float64, lo, hi);
  set_requires_grad(t);
  return t;
}

/// `t` (any strides) as a new leaf requiring grad that shares its storage.
inline tensor as_leaf(const tensor& t) {
  tensor l = t.detach();
  set_requires_grad(l);
  return l;
}

/// A float64 leaf requiring grad with the given values.
inline tensor leaf_of(std::vector<double> v, shape_t shape) {
  tensor t = from_vector<double>(v, std::move(shape));
  set_requires_grad(t);
  return t;
}

/// The values of `t` as doubles in row-major order.
inline std::vector<double> values(const tensor& t) {
  no_grad_guard ng;
  const tensor c = t.to(dtype::float64).contiguous();
  const double* p = c.data<double>();
  return std::vector<double>(p, p + c.numel());
}

/// A node whose backward is a lambda (custom nodes, as distributed autograd writes them).
class lambda_node final : public grad_node {
 public:
  lambda_node(std::string name, edge_list next, std::uint32_t n_in, std::function<tensor_list(tensor_list&&)> fn)
      : grad_node(std::move(name), std::move(next), n_in), fn_(std::move(fn)) {}
  tensor_list apply(tensor_list&& grads) override { return fn_(std::move(grads)); }

 private:
  std::function<tensor_list(tensor_list&&)> fn_;
};

/// Makes `out` the `nr`-th output of `fn` (what autograd_meta::record does for op nodes).
inline void attach(const tensor& out, std::shared_ptr<grad_node> fn, std::uint32_t nr = 0) {
  auto& m = materialize_meta(out);
  m.grad_fn = std::move(fn);
  m.output_nr = nr;
}

/// gradcheck with the failure text reported through Catch (the thrown troupe::error's message).
inline std::string gradcheck_failure(const std::function<tensor(const tensor_list&)>& f, const tensor_list& inputs,
                                     double eps = 1e-6, double atol = 1e-5, double rtol = 1e-3) {
  try {
    gradcheck(f, inputs, eps, atol, rtol);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

/// One row of a gradcheck table: an op applied to inputs, with its finite-difference tolerances.
struct grad_case {
  std::string name;
  std::function<tensor(const tensor_list&)> f;
  tensor_list inputs;
  double eps = 1e-6, atol = 1e-5, rtol = 1e-3;
};

/// Gradchecks every case of a table, naming the op of any failure.
inline void check_all(const std::vector<grad_case>& cases) {
  for (const auto& c : cases) {
    INFO("op: " << c.name);
    CHECK(gradcheck_failure(c.f, c.inputs, c.eps, c.atol, c.rtol) == "");
  }
}

}  // namespace troupe::test

