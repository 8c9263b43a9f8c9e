// The tensor-level autograd API: requires_grad, .grad, hooks, retain_grad, in-place rules.
#include <catch2/catch.hpp>

#include "autograd/autograd_test_util.hpp"
#include "troupe/autograd/engine.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace troupe;
using troupe::test::leaf_of;
using troupe::test::values;

namespace {
bool has_code(const std::function<void()>& f, errc code, const std::string& text) {
  try {
    f();
  } catch (const error& e) {
    INFO(e.what());
    return e.code() == code && e.message().find(text) != std::string::npos;
  }
  return false;
}
}  // namespace

TEST_CASE("requires_grad can be set only on floating point leaves", "[autograd][variable]") {
  tensor i = from_vector<std::int64_t>({1, 2});
  CHECK(has_code([&] { set_requires_grad(i); }, errc::dtype_mismatch, "int64"));
  tensor x = leaf_of({1.0}, {1});
  CHECK(x.requires_grad());
  CHECK(is_leaf(x));
  tensor y = x * 2.0;
  CHECK_FALSE(is_leaf(y));
  CHECK(output_nr(y) == 0);
  CHECK(has_code([&] { set_requires_grad(y, false); }, errc::autograd_error, "detach()"));
  set_requires_grad(x, false);
  CHECK_FALSE(x.requires_grad());
  tensor d = y.detach();
  CHECK(is_leaf(d));
  CHECK_FALSE(d.requires_grad());
}

TEST_CASE("set_grad checks the gradient against the tensor and zero_grad zeroes in place", "[autograd][variable]") {
  tensor x = leaf_of({1.0, 2.0}, {2});
  CHECK_FALSE(grad(x).defined());
  CHECK(has_code([&] { set_grad(x, ones({3}, dtype::float64)); }, errc::shape_mismatch, "[3]"));
  CHECK(has_code([&] { set_grad(x, ones({2}, dtype::float32)); }, errc::dtype_mismatch, "float32"));
  set_grad(x, full({2}, 5.0, dtype::float64));
  tensor g = grad(x);
  backward(sum(x));
  CHECK(values(grad(x)) == std::vector<double>{6.0, 6.0});
  CHECK(grad(x).is_same(g));  // accumulated in place
  zero_grad(x);
  CHECK(values(g) == std::vector<double>{0.0, 0.0});
  set_grad(x, tensor());
  CHECK_FALSE(grad(x).defined());
}

TEST_CASE("a tensor hook can replace the gradient of a non-leaf and of a leaf", "[autograd][hooks]") {
  tensor x = leaf_of({1.0, 2.0}, {2});
  tensor y = x * 2.0;
  std::vector<double> seen;
  auto h1 = register_hook(y, [&](const tensor& g) {
    seen = values(g);
    return g * 10.0;
  });
  auto h2 = register_hook(x, [](const tensor& g) { return g + 1.0; });
  backward(sum(y * 3.0));
  CHECK(seen == std::vector<double>{3.0, 3.0});
  CHECK(values(grad(x)) == std::vector<double>{61.0, 61.0});  // 3 * 10 * 2 + 1
  h1.remove();
  h2.remove();
  CHECK_FALSE(h1.active());
  zero_grad(x);
  tensor y2 = x * 2.0;
  auto keep = register_hook(y2, [](const tensor&) { return tensor(); });  // observes, keeps grad
  backward(sum(y2));
  CHECK(values(grad(x)) == std::vector<double>{2.0, 2.0});
  CHECK(has_code([&] { register_hook(ones({1}), [](const tensor& g) { return g; }); }, errc::autograd_error,
                 "does not require grad"));
}

TEST_CASE("a post-accumulate-grad hook fires once per leaf per backward with the accumulated grad",
          "[autograd][hooks]") {
  tensor x = leaf_of({1.0, -1.0}, {2});
  std::vector<std::vector<double>> seen;
  auto h = register_post_accumulate_grad_hook(x, [&](const tensor& leaf) {
    CHECK(leaf.is_same(x));
    seen.push_back(values(grad(leaf)));
  });
  backward(sum(x * x + x * 3.0));
  REQUIRE(seen.size() == 1);
  CHECK(seen[0] == std::vector<double>{5.0, 1.0});
  backward(sum(x * 2.0));
  REQUIRE(seen.size() == 2);
  CHECK(seen[1] == std::vector<double>{7.0, 3.0});
  h.remove();
  backward(sum(x));
  CHECK(seen.size() == 2);
  tensor y = x * 1.0;
  CHECK(has_code([&] { register_post_accumulate_grad_hook(y, [](const tensor&) {}); }, errc::autograd_error,
                 "not a leaf"));
}

TEST_CASE("node pre-hooks and post-hooks see the gradients and pre-hooks can change them", "[autograd][hooks]") {
  tensor x = leaf_of({1.0, 2.0}, {2});
  tensor y = x * 4.0;
  auto fn = grad_fn(y);
  std::vector<double> pre_seen, post_in, post_out;
  auto pre = fn->register_pre_hook([&](tensor_list& g) {
    pre_seen = values(g[0]);
    g[0] = g[0] * 0.5;
  });
  auto post = fn->register_post_hook([&](const tensor_list& grad_inputs, const tensor_list& grad_outputs) {
    post_in = values(grad_inputs[0]);
    post_out = values(grad_outputs[0]);
  });
  backward(sum(y * from_vector<double>({1.0, 3.0})));
  CHECK(pre_seen == std::vector<double>{1.0, 3.0});
  CHECK(post_out == std::vector<double>{0.5, 1.5});
  CHECK(post_in == std::vector<double>{2.0, 6.0});
  CHECK(values(grad(x)) == std::vector<double>{2.0, 6.0});
}

TEST_CASE("retain_grad keeps the gradient of a non-leaf", "[autograd][variable]") {
  tensor x = leaf_of({1.0, 2.0}, {2});
  tensor y = x * 3.0;
  tensor z = x * 2.0;
  retain_grad(y);
  backward(sum(y * y + z * z));
  CHECK(values(grad(y)) == std::vector<double>{6.0, 12.0});
  CHECK_FALSE(grad(z).defined());
}

TEST_CASE("an in-place op on a leaf that requires grad is an error naming the op", "[autograd][inplace]") {
  tensor x = leaf_of({1.0, 2.0}, {2});
  CHECK(has_code([&] { x.mul_(2.0); }, errc::autograd_error, "leaf tensor that requires grad"));
  CHECK(has_code([&] { x.add_(ones({2}, dtype::float64)); }, errc::autograd_error, "in-place operation add"));
  CHECK(has_code([&] { x.fill_(7.0); }, errc::autograd_error, "in-place operation fill_"));
  CHECK(has_code([&] { x.copy_(zeros({2}, dtype::float64)); }, errc::autograd_error, "in-place operation copy_"));
  CHECK(values(x) == std::vector<double>{1.0, 2.0});  // refused before writing: data untouched
  CHECK(x.version() == 0);
  tensor p = leaf_of({1.0, 2.0}, {2});
  {
    no_grad_guard ng;  // allowed without recording, as optimizers do
    p.mul_(2.0);
  }
  CHECK(values(p) == std::vector<double>{2.0, 4.0});
  CHECK(is_leaf(p));
}

TEST_CASE("modifying a saved tensor in place makes backward fail naming the op that saved it",
          "[autograd][inplace]") {
  tensor x = leaf_of({1.0, 2.0}, {2});
  tensor a = x * 1.0;
  tensor b = a * a;  // saves a
  a.add_(1.0);
  CHECK(has_code([&] { backward(sum(b)); }, errc::autograd_error, "saved tensor of mul was modified in place (version 1, expected 0)"));
  CHECK(has_code([&] { backward(sum(b * 1.0)); }, errc::autograd_error, "modified in place (version"));
}

TEST_CASE("an in-place op on a non-leaf rebases its history and gives correct gradients", "[autograd][inplace]") {
  tensor x = leaf_of({1.0, 2.0}, {2});
  tensor w = leaf_of({3.0, 5.0}, {2});
  tensor a = x * 2.0;
  a.mul_(w);          // a = 2 x w
  a.add_(x, 2.0);     // a = 2 x w + 2 x
  a.sub_(w);          // a = 2 x w + 2 x - w
  a.div_(2.0);        // a = x w + x - w / 2
  REQUIRE(grad_fn(a) != nullptr);
  backward(sum(a * a));
  const std::vector<double> xs{1.0, 2.0}, ws{3.0, 5.0};
  const auto gx = values(grad(x)), gw = values(grad(w));
  for (std::size_t i = 0; i < 2; ++i) {
    const double av = xs[i] * ws[i] + xs[i] - ws[i] / 2;
    CHECK(gx[i] == Approx(2 * av * (ws[i] + 1)));
    CHECK(gw[i] == Approx(2 * av * (xs[i] - 0.5)));
  }
  // A tensor that did not require grad starts requiring it when a grad-requiring value is
  // copied into it.
  tensor z = zeros({2}, dtype::float64);
  z.copy_(x * 3.0);
  CHECK(z.requires_grad());
  zero_grad(x);
  backward(sum(z));
  CHECK(values(grad(x)) == std::vector<double>{3.0, 3.0});
}

TEST_CASE("an in-place op on a view of a tensor that requires grad is rejected as unsupported",
          "[autograd][inplace]") {
  tensor x = leaf_of({1.0, 2.0, 3.0}, {3});
  tensor a = x * 2.0;
  CHECK(has_code([&] { a.slice(0, 0, 2).mul_(2.0); }, errc::not_supported, "view"));
  CHECK(has_code([&] { x.narrow(0, 1, 1).add_(1.0); }, errc::not_supported, "clone()"));
}
