// gradcheck itself, and ops recorded by hand through record_op (the tensors-layer seam):
// a wrong formula is caught, multi-output ops see undefined gradients, bad records are named.
#include <catch2/catch.hpp>

#include "autograd/autograd_test_util.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace troupe;
using troupe::test::gradcheck_failure;
using troupe::test::leaf;

namespace {
// x * x recorded by hand with backward `factor * x * g` (2 is right).
tensor square_op(const tensor& x, double factor, const char* name = "square") {
  tensor out;
  {
    no_grad_guard ng;
    out = x * x;
  }
  if (should_record({&x})) {
    op_record rec;
    rec.name = name;
    rec.inputs = {x};
    rec.outputs = {out};
    rec.saved = {x};
    rec.backward = [factor](const backward_ctx& c) -> tensor_list {
      return {c.grad_outputs[0] * c.saved[0] * factor};
    };
    record_op(std::move(rec));
  }
  return out;
}
}  // namespace

TEST_CASE("gradcheck accepts a correct formula and names the first mismatch of a wrong one", "[autograd][gradcheck]") {
  const tensor x = leaf({2, 2}, 91);
  CHECK(gradcheck([](const tensor_list& v) { return square_op(v[0], 2.0); }, {x}));
  const auto msg = gradcheck_failure([](const tensor_list& v) { return square_op(v[0], 3.0); }, {x});
  CHECK_THAT(msg, Catch::Contains("input 0") && Catch::Contains("element [0, 0]") && Catch::Contains("numeric") &&
                      Catch::Contains("analytic"));
  // A formula that is right for one input but wrong for another is found too.
  const tensor y = leaf({3}, 92);
  const auto msg2 = gradcheck_failure([](const tensor_list& v) { return v[1] * 2.0 + square_op(v[0], 2.5); }, {y, y * 1.0});
  CHECK_THAT(msg2, Catch::Contains("input 0"));
}

TEST_CASE("gradcheck rejects inputs it cannot check and outputs without a graph", "[autograd][gradcheck]") {
  tensor f32 = ones({2});
  set_requires_grad(f32);
  CHECK_THROWS_WITH(gradcheck([](const tensor_list& v) { return v[0] * 2.0; }, {f32}), Catch::Contains("float64"));
  CHECK_THROWS_WITH(gradcheck([](const tensor_list& v) { return v[0] * 2.0; }, {ones({2}, dtype::float64)}),
                    Catch::Contains("no input requires grad"));
  CHECK_THROWS_WITH(gradcheck([](const tensor_list& v) { return v[0].detach() * 2.0; }, {leaf({2}, 93)}),
                    Catch::Contains("does not require grad"));
}

TEST_CASE("a backward formula returning a gradient of the wrong shape is named in the error", "[autograd][engine]") {
  tensor x = leaf({3}, 94);
  tensor out;
  {
    no_grad_guard ng;
    out = x * 2.0;
  }
  op_record rec;
  rec.name = "forgot_sum_to";
  rec.inputs = {x};
  rec.outputs = {out};
  rec.backward = [](const backward_ctx& c) -> tensor_list { return {c.grad_outputs[0].reshape({3, 1})}; };
  record_op(std::move(rec));
  CHECK_THROWS_WITH(backward(sum(out)), Catch::Contains("forgot_sum_to") && Catch::Contains("[3, 1]"));
}

TEST_CASE("a multi-output op receives undefined gradients for outputs that got none", "[autograd][engine]") {
  tensor x = leaf({2}, 95);
  tensor o1, o2;
  {
    no_grad_guard ng;
    o1 = x * 2.0;
    o2 = x * 3.0;
  }
  std::vector<bool> defined;
  op_record rec;
  rec.name = "two_outputs";
  rec.inputs = {x};
  rec.outputs = {o1, o2};
  rec.backward = [&defined](const backward_ctx& c) -> tensor_list {
    defined = {c.grad_outputs[0].defined(), c.grad_outputs[1].defined()};
    tensor g = zeros({2}, dtype::float64);
    if (c.grad_outputs[0].defined()) g = g + c.grad_outputs[0] * 2.0;
    if (c.grad_outputs[1].defined()) g = g + c.grad_outputs[1] * 3.0;
    return {g};
  };
  record_op(std::move(rec));
  CHECK(output_nr(o2) == 1);
  CHECK(grad_fn(o1) == grad_fn(o2));
  backward(sum(o2), {}, true);
  CHECK(defined == std::vector<bool>{false, true});
  CHECK(test::values(grad(x)) == std::vector<double>{3.0, 3.0});
  backward(sum(o1 + o2));  // both outputs feed one root: one call with both gradients
  CHECK(defined == std::vector<bool>{true, true});
  CHECK(test::values(grad(x)) == std::vector<double>{8.0, 8.0});
}
