// Finite-difference checks of every differentiable op of elementwise.hpp, with broadcasting
// and non-contiguous inputs, and of the in-place tensor methods.
#include <catch2/catch.hpp>

#include "autograd/autograd_test_util.hpp"
#include "troupe/tensors/elementwise.hpp"

using namespace troupe;
using troupe::test::check_all;
using troupe::test::grad_case;
using troupe::test::leaf;

namespace {

// A non-contiguous float64 leaf of shape [r, c] (the transpose of a contiguous [c, r]).
tensor transposed_leaf(std::int64_t r, std::int64_t c, std::uint64_t seed, double lo = -1.0, double hi = 1.0) {
  tensor t = leaf({c, r}, seed, lo, hi).detach().t();
  set_requires_grad(t);
  return t;
}
}  // namespace

TEST_CASE("binary elementwise ops have correct gradients, also when broadcasting", "[autograd][gradcheck]") {
  const tensor a = leaf({2, 3}, 1), b = leaf({2, 3}, 2);
  const tensor col = leaf({2, 1}, 3), row = leaf({3}, 4);
  const tensor pos = leaf({2, 3}, 5, 0.5, 2.0), pos_row = leaf({3}, 6, 0.5, 2.0);
  const tensor at = transposed_leaf(2, 3, 7);
  check_all({
      {"add", [](const tensor_list& v) { return add(v[0], v[1]); }, {a, b}},
      {"add alpha broadcast", [](const tensor_list& v) { return add(v[0], v[1], -2.5); }, {col, row}},
      {"sub", [](const tensor_list& v) { return sub(v[0], v[1]); }, {a, row}},
      {"sub alpha", [](const tensor_list& v) { return sub(v[0], v[1], 0.5); }, {col, b}},
      {"mul", [](const tensor_list& v) { return mul(v[0], v[1]); }, {a, b}},
      {"mul broadcast", [](const tensor_list& v) { return mul(v[0], v[1]); }, {col, row}},
      {"mul non-contiguous", [](const tensor_list& v) { return mul(v[0], v[1]); }, {at, b}},
      {"div", [](const tensor_list& v) { return div(v[0], v[1]); }, {a, pos}},
      {"div broadcast", [](const tensor_list& v) { return div(v[0], v[1]); }, {col, pos_row}},
      {"pow tensor", [](const tensor_list& v) { return pow(v[0], v[1]); }, {pos, a}},
      {"pow tensor broadcast", [](const tensor_list& v) { return pow(v[0], v[1]); }, {pos, row}},
      {"maximum", [](const tensor_list& v) { return maximum(v[0], v[1]); }, {a, b}},
      {"minimum broadcast", [](const tensor_list& v) { return minimum(v[0], v[1]); }, {col, row}},
      {"where", [](const tensor_list& v) { return where(gt(v[0], 0.0), v[0], v[1]); }, {a, row}},
      {"operators", [](const tensor_list& v) { return (v[0] - v[1]) * v[0] / (v[1] + 3.0); }, {at, row}},
  });
}

TEST_CASE("tensor-scalar elementwise ops have correct gradients", "[autograd][gradcheck]") {
  const tensor a = leaf({2, 3}, 11), pos = leaf({3, 2}, 12, 0.5, 2.0);
  const tensor at = transposed_leaf(2, 3, 13);
  check_all({
      {"add scalar", [](const tensor_list& v) { return add(v[0], 1.5); }, {a}},
      {"sub scalar", [](const tensor_list& v) { return sub(v[0], 1.5); }, {at}},
      {"mul scalar", [](const tensor_list& v) { return mul(v[0], -3.0); }, {a}},
      {"div scalar", [](const tensor_list& v) { return div(v[0], 4.0); }, {at}},
      {"pow scalar", [](const tensor_list& v) { return pow(v[0], 3.0); }, {a}},
      {"pow fractional", [](const tensor_list& v) { return pow(v[0], 1.7); }, {pos}},
      {"pow negative", [](const tensor_list& v) { return pow(v[0], -2.0); }, {pos}},
      {"rsub", [](const tensor_list& v) { return rsub(v[0], 2.0); }, {a}},
      {"rdiv", [](const tensor_list& v) { return rdiv(v[0], 2.0); }, {pos}},
      {"scalar operators", [](const tensor_list& v) { return 2.0 - v[0] * 3.0 + 1.0 / v[1]; }, {a, pos.t()}},
  });
}

TEST_CASE("unary elementwise ops have correct gradients", "[autograd][gradcheck]") {
  const tensor a = leaf({3, 4}, 21, -2.0, 2.0), pos = leaf({3, 4}, 22, 0.5, 3.0);
  const tensor at = transposed_leaf(3, 4, 23, -2.0, 2.0);
  check_all({
      {"neg", [](const tensor_list& v) { return neg(v[0]); }, {a}},
      {"abs", [](const tensor_list& v) { return abs(v[0]); }, {a}},
      {"exp", [](const tensor_list& v) { return exp(v[0]); }, {at}},
      {"log", [](const tensor_list& v) { return log(v[0]); }, {pos}},
      {"sqrt", [](const tensor_list& v) { return sqrt(v[0]); }, {pos}},
      {"rsqrt", [](const tensor_list& v) { return rsqrt(v[0]); }, {pos}},
      {"relu", [](const tensor_list& v) { return relu(v[0]); }, {a}},
      {"sigmoid", [](const tensor_list& v) { return sigmoid(v[0]); }, {at}},
      {"tanh", [](const tensor_list& v) { return tanh(v[0]); }, {a}},
      {"gelu", [](const tensor_list& v) { return gelu(v[0]); }, {at}},
      {"sign (zero gradient)", [](const tensor_list& v) { return sign(v[0]) * v[0]; }, {a}},
      {"methods", [](const tensor_list& v) { return v[0].exp().sqrt().log().tanh().sigmoid().relu(); }, {at}},
  });
}

TEST_CASE("in-place tensor methods have correct gradients through the rebased history", "[autograd][gradcheck]") {
  const tensor a = leaf({2, 3}, 31), b = leaf({2, 3}, 32), row = leaf({3}, 33, 0.5, 2.0);
  check_all({
      {"add_", [](const tensor_list& v) { tensor t = v[0] * 1.0; t.add_(v[1], 0.5); return t; }, {a, b}},
      {"add_ scalar", [](const tensor_list& v) { tensor t = v[0] * 2.0; t.add_(3.0); return t * v[0]; }, {a}},
      {"sub_ broadcast", [](const tensor_list& v) { tensor t = v[0] * 1.0; t.sub_(v[1]); return t; }, {a, row}},
      {"mul_", [](const tensor_list& v) { tensor t = v[0] * 1.0; t.mul_(v[1]); return t; }, {a, b}},
      {"mul_ scalar", [](const tensor_list& v) { tensor t = v[0] * v[0]; t.mul_(-2.0); return t; }, {a}},
      {"div_", [](const tensor_list& v) { tensor t = v[0] * 1.0; t.div_(v[1]); return t; }, {a, row}},
      {"div_ scalar", [](const tensor_list& v) { tensor t = v[0] + 0.0; t.div_(3.0); return t; }, {a}},
      {"copy_", [](const tensor_list& v) { tensor t = zeros({2, 3}, dtype::float64); t.copy_(v[1]); return t * v[0]; },
       {a, row}},
  });
}
