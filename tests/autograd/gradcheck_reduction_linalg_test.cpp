// Finite-difference checks of every differentiable op of reduction.hpp and linalg.hpp.
#include <catch2/catch.hpp>

#include "autograd/autograd_test_util.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace troupe;
using troupe::test::check_all;
using troupe::test::grad_case;
using troupe::test::leaf;

namespace {

tensor transposed_leaf(std::int64_t r, std::int64_t c, std::uint64_t seed) {
  tensor t = leaf({c, r}, seed).detach().t();
  set_requires_grad(t);
  return t;
}
}  // namespace

TEST_CASE("reductions have correct gradients over all dims, some dims and with keepdim", "[autograd][gradcheck]") {
  const tensor a = leaf({2, 3, 4}, 41);
  const tensor at = transposed_leaf(3, 5, 42);
  check_all({
      {"sum all", [](const tensor_list& v) { return sum(v[0]); }, {a}},
      {"sum dim", [](const tensor_list& v) { return sum(v[0], {1}); }, {a}},
      {"sum dims keepdim", [](const tensor_list& v) { return sum(v[0], {0, 2}, true); }, {a}},
      {"sum negative dim", [](const tensor_list& v) { return sum(v[0], {-1}); }, {at}},
      {"mean all", [](const tensor_list& v) { return mean(v[0]); }, {a}},
      {"mean dims", [](const tensor_list& v) { return mean(v[0], {0, 1}); }, {a}},
      {"mean keepdim", [](const tensor_list& v) { return mean(v[0], {1}, true); }, {at}},
      {"amax all", [](const tensor_list& v) { return amax(v[0]); }, {a}},
      {"amax dim", [](const tensor_list& v) { return amax(v[0], {2}); }, {a}},
      {"amin dim keepdim", [](const tensor_list& v) { return amin(v[0], {0}, true); }, {at}},
      {"var all", [](const tensor_list& v) { return var(v[0]); }, {a}},
      {"var dim biased", [](const tensor_list& v) { return var(v[0], {1}, false); }, {a}},
      {"var dims keepdim", [](const tensor_list& v) { return var(v[0], {0, 2}, true, true); }, {a}},
      {"var non-contiguous", [](const tensor_list& v) { return var(v[0], {0}); }, {at}},
      {"sum_to", [](const tensor_list& v) { return sum_to(v[0], {3, 1}); }, {a}},
      {"methods", [](const tensor_list& v) { return v[0].sum({0}).mean(); }, {a}},
  });
}

TEST_CASE("matrix products have correct gradients for every operand layout", "[autograd][gradcheck]") {
  const tensor v3 = leaf({3}, 51), w3 = leaf({3}, 52), m23 = leaf({2, 3}, 53), m34 = leaf({3, 4}, 54);
  const tensor b234 = leaf({2, 3, 4}, 55), b2145 = leaf({2, 1, 4, 5}, 56), b345 = leaf({3, 4, 5}, 57);
  const tensor m23t = transposed_leaf(2, 3, 58), m34t = transposed_leaf(3, 4, 59);
  const tensor c24 = leaf({2, 4}, 60), c4 = leaf({4}, 61);
  check_all({
      {"matmul 1d.1d", [](const tensor_list& v) { return matmul(v[0], v[1]); }, {v3, w3}},
      {"matmul 2d.1d", [](const tensor_list& v) { return matmul(v[0], v[1]); }, {m23, v3}},
      {"matmul 1d.2d", [](const tensor_list& v) { return matmul(v[0], v[1]); }, {v3, m34}},
      {"matmul 2d.2d", [](const tensor_list& v) { return matmul(v[0], v[1]); }, {m23, m34}},
      {"matmul transposed operands", [](const tensor_list& v) { return matmul(v[0], v[1]); }, {m23t, m34t}},
      {"matmul batched.2d non-contiguous", [](const tensor_list& v) { return matmul(v[0], v[1]); },
       {b234, test::as_leaf(leaf({2, 4}, 63).t())}},
      {"matmul through a view input", [](const tensor_list& v) { return matmul(v[0], v[1]); }, {m23, m34.t().t()}},
      {"matmul broadcast batch", [](const tensor_list& v) { return matmul(v[0], v[1]); }, {test::as_leaf(b2145.transpose(2, 3)), b345}},
      {"matmul 1d.batched", [](const tensor_list& v) { return matmul(v[0], v[1]); }, {v3, b234}},
      {"bmm", [](const tensor_list& v) { return bmm(v[0], v[1].transpose(1, 2)); }, {b234, leaf({2, 5, 4}, 62)}},
      {"addmm", [](const tensor_list& v) { return addmm(v[0], v[1], v[2]); }, {c24, m23, m34}},
      {"addmm scaled broadcast bias", [](const tensor_list& v) { return addmm(v[0], v[1], v[2], 0.5, -2.0); },
       {c4, m23t, m34}},
      {"method", [](const tensor_list& v) { return v[0].matmul(v[1]); }, {m23, m34t}},
  });
}
