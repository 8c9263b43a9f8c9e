// nn modules: registration order, state dicts, initialisation, layer behaviour, gradients, losses.
#include <catch2/catch.hpp>

#include <cmath>

#include "troupe/autograd/gradcheck.hpp"
#include "troupe/autograd/nn/activation.hpp"
#include "troupe/autograd/nn/dropout.hpp"
#include "troupe/autograd/nn/embedding.hpp"
#include "troupe/autograd/nn/layer_norm.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/nn/loss.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace troupe;

namespace {

// A module with its own parameter registered before and after a child, and a buffer.
class block : public nn::unary_module {
 public:
  explicit block(generator& gen) {
    scale = ones({3});
    register_parameter("scale", scale);
    body = register_module("body", std::make_shared<nn::sequential>(std::make_shared<nn::linear>(3, 4, gen),
                                                                    std::make_shared<nn::relu>(),
                                                                    std::make_shared<nn::linear>(4, 2, gen)));
    shift = zeros({2});
    register_parameter("shift", shift);
    count = zeros({1});
    register_buffer("count", count);
  }
  tensor forward(const tensor& x) override { return body->forward(x * scale) + shift; }
  tensor scale, shift, count;
  std::shared_ptr<nn::sequential> body;
};

std::vector<std::string> names_of(const std::vector<std::pair<std::string, tensor>>& v) {
  std::vector<std::string> out;
  for (const auto& e : v) out.push_back(e.first);
  return out;
}

}  // namespace

TEST_CASE("parameters come in registration order, own parameters before children's", "[autograd][nn]") {
  generator gen(1);
  block b(gen);
  const std::vector<std::string> expected = {"scale", "shift", "body.0.weight", "body.0.bias", "body.2.weight",
                                             "body.2.bias"};
  CHECK(names_of(b.named_parameters()) == expected);
  const auto params = b.parameters();
  REQUIRE(params.size() == 6);
  CHECK(params[0].is_same(b.scale));
  CHECK(params[1].is_same(b.shift));
  auto& first = dynamic_cast<nn::linear&>((*b.body)[0]);
  CHECK(params[2].is_same(first.weight));
  CHECK(params[3].is_same(first.bias));
  for (const auto& p : params) CHECK(p.requires_grad());
  CHECK(names_of(b.named_buffers()) == std::vector<std::string>{"count"});
  CHECK_FALSE(b.count.requires_grad());
}

TEST_CASE("registering a duplicate or dotted name is rejected", "[autograd][nn]") {
  struct bad : nn::module {
    explicit bad(int which) {
      t = zeros({1});
      u = zeros({1});
      register_parameter("w", t);
      if (which == 0) register_buffer("w", u);
      if (which == 1) register_parameter("a.b", u);
    }
    tensor t, u;
  };
  CHECK_THROWS_MATCHES(bad(0), error, Catch::Predicate<error>([](const error& e) {
                         return e.code() == errc::bad_argument && e.message().find("'w'") != std::string::npos;
                       }));
  CHECK_THROWS_AS(bad(1), error);
}

TEST_CASE("a state dict round trip copies every parameter and buffer", "[autograd][nn]") {
  generator g1(1), g2(2);
  block a(g1), b(g2);
  a.count.fill_(7);
  const auto sd = a.state_dict();
  CHECK(sd.size() == 7);
  CHECK_FALSE(equal(sd.at("body.0.weight"), b.state_dict().at("body.0.weight")));
  const tensor handle_before = b.body->parameters()[0];
  b.load_state_dict(sd);
  for (const auto& [name, t] : b.state_dict()) CHECK(equal(t, sd.at(name)));
  CHECK(b.body->parameters()[0].is_same(handle_before));  // loaded in place
  CHECK(b.count.item() == 7.0);
  CHECK(b.parameters()[0].requires_grad());
}

TEST_CASE("loading a state dict with a wrong shape names the key and both shapes", "[autograd][nn]") {
  generator gen(3);
  nn::linear small(3, 4, gen), big(5, 4, gen);
  const tensor before = small.weight.clone();
  auto sd = big.state_dict();
  CHECK_THROWS_MATCHES(small.load_state_dict(sd), error, Catch::Predicate<error>([](const error& e) {
                         return e.code() == errc::shape_mismatch && e.message().find("'weight'") != std::string::npos &&
                                e.message().find("[4, 5]") != std::string::npos &&
                                e.message().find("[4, 3]") != std::string::npos;
                       }));
  CHECK(equal(small.weight, before));  // nothing copied
  auto sd64 = small.state_dict();
  sd64["bias"] = zeros({4}, dtype::float64);
  CHECK_THROWS_MATCHES(small.load_state_dict(sd64), error,
                       Catch::Predicate<error>([](const error& e) { return e.code() == errc::dtype_mismatch; }));
}

TEST_CASE("strict loading reports missing and unexpected keys; non-strict ignores them", "[autograd][nn]") {
  generator gen(4);
  nn::linear lin(2, 2, gen);
  auto sd = lin.state_dict();
  sd.erase("bias");
  sd["extra"] = zeros({1});
  CHECK_THROWS_MATCHES(lin.load_state_dict(sd), error, Catch::Predicate<error>([](const error& e) {
                         return e.code() == errc::bad_argument && e.message().find("'bias'") != std::string::npos &&
                                e.message().find("'extra'") != std::string::npos;
                       }));
  sd["weight"] = full({2, 2}, 0.5);
  lin.load_state_dict(sd, false);
  CHECK(equal(lin.weight, full({2, 2}, 0.5)));
}

TEST_CASE("linear initialises weight and bias within 1/sqrt(in_features)", "[autograd][nn]") {
  generator gen(5);
  nn::linear lin(16, 500, gen);
  const double bound = 0.25;
  CHECK(amax(abs(lin.weight)).item() <= bound);
  CHECK(amax(abs(lin.bias)).item() <= bound);
  // 8000 uniform draws: the extremes come close to the bound and the mean is near zero.
  CHECK(amax(lin.weight).item() > 0.95 * bound);
  CHECK(amin(lin.weight).item() < -0.95 * bound);
  CHECK(std::abs(mean(lin.weight).item()) < 0.01);
  generator again(5);
  nn::linear same(16, 500, again);
  CHECK(equal(same.weight, lin.weight));
  CHECK_THROWS_AS(lin.forward(zeros({2, 15})), error);
}

TEST_CASE("linear computes x W^T + b and its gradients pass gradcheck", "[autograd][nn]") {
  generator gen(6);
  nn::linear lin(3, 2, gen, true, dtype::float64);
  {
    no_grad_guard guard;
    lin.weight.copy_(from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}));
    lin.bias.copy_(from_vector<double>({0.5, -0.5}));
  }
  const tensor y = lin.forward(from_vector<double>({1, 0, -1}, {1, 3}));
  CHECK(equal(y, from_vector<double>({-1.5, -2.5}, {1, 2})));
  tensor x = randn({4, 3}, gen, dtype::float64);
  set_requires_grad(x);
  CHECK(gradcheck([&](const tensor_list& in) { return lin.forward(in[0]); }, {x, lin.weight, lin.bias}));
  tensor x3 = randn({2, 2, 3}, gen, dtype::float64);  // batched input goes through matmul
  set_requires_grad(x3);
  CHECK(gradcheck([&](const tensor_list& in) { return lin.forward(in[0]); }, {x3, lin.weight, lin.bias}));
}

TEST_CASE("layer norm normalises the trailing dims and passes gradcheck", "[autograd][nn]") {
  generator gen(7);
  nn::layer_norm ln({4}, 1e-5, true, dtype::float64);
  const tensor x = randn({3, 4}, gen, dtype::float64, 2.0, 3.0);
  const tensor y = ln.forward(x);
  CHECK(amax(abs(mean(y, {1}))).item() < 1e-12);
  CHECK(amax(abs(mean(y * y, {1}) - 1.0)).item() < 1e-4);  // biased variance 1 (up to eps)
  uniform_(ln.weight, gen, 0.5, 1.5);
  uniform_(ln.bias, gen, -1, 1);
  tensor xg = x.clone();
  set_requires_grad(xg);
  CHECK(gradcheck([&](const tensor_list& in) { return ln.forward(in[0]); }, {xg, ln.weight, ln.bias}));
  CHECK_THROWS_AS(ln.forward(zeros({3, 5}, dtype::float64)), error);
}

TEST_CASE("dropout zeroes about p of the elements, scales the rest, and is the identity in eval", "[autograd][nn]") {
  generator gen(8);
  nn::dropout drop(0.25, gen);
  const tensor x = ones({100000});
  const tensor y = drop.forward(x);
  const double kept = sum(ne(y, 0.0).to(dtype::float64)).item();
  CHECK(std::abs(kept / 100000.0 - 0.75) < 0.01);  // 0.75 ± 7 standard deviations (0.00137)
  CHECK(amax(y).item() == Approx(1.0 / 0.75));
  CHECK(amin(where(ne(y, 0.0), y, full({100000}, 10.0))).item() == Approx(1.0 / 0.75));
  generator again(8);
  nn::dropout same(0.25, again);
  CHECK(equal(same.forward(x), y));  // same seed, same mask
  CHECK_FALSE(equal(drop.forward(x), y));  // the generator advanced
  drop.eval();
  CHECK(drop.forward(x).is_same(x));
  CHECK_THROWS_AS(nn::dropout(1.0, gen), error);
}

TEST_CASE("dropout's gradient is its mask scaled by 1/(1-p)", "[autograd][nn]") {
  generator gen(9);
  nn::dropout drop(0.5, gen);
  tensor x = ones({1000}, dtype::float64);
  set_requires_grad(x);
  const tensor y = drop.forward(x);
  backward(sum(y));
  CHECK(equal(grad(x), y.detach()));  // y = mask * 2 * 1, dy/dx = mask * 2
}

TEST_CASE("embedding looks up rows and accumulates gradients of repeated indices", "[autograd][nn]") {
  generator gen(10);
  nn::embedding emb(5, 3, gen, dtype::float64);
  const tensor idx = from_vector<std::int64_t>({4, 1, 4, 0}, {2, 2});
  const tensor y = emb.forward(idx);
  REQUIRE(y.shape() == shape_t{2, 2, 3});
  CHECK(equal(y.select(0, 0).select(0, 0), emb.weight.select(0, 4)));
  CHECK(equal(y.select(0, 1).select(0, 1), emb.weight.select(0, 0)));
  backward(sum(y));
  const tensor g = grad(emb.weight);
  CHECK(equal(g.select(0, 4), full({3}, 2.0, dtype::float64)));
  CHECK(equal(g.select(0, 2), zeros({3}, dtype::float64)));
  CHECK(gradcheck([&](const tensor_list&) { return emb.forward(idx); }, {emb.weight}));
  CHECK_THROWS_MATCHES(emb.forward(from_vector<std::int64_t>({5})), error,
                       Catch::Predicate<error>([](const error& e) { return e.code() == errc::index_out_of_range; }));
  CHECK_THROWS_AS(emb.forward(zeros({2})), error);
}

TEST_CASE("train and eval propagate to every child", "[autograd][nn]") {
  generator gen(11);
  block b(gen);
  CHECK(b.is_training());
  b.eval();
  CHECK_FALSE(b.is_training());
  CHECK_FALSE((*b.body)[1].is_training());
  b.train();
  CHECK((*b.body)[2].is_training());
}

TEST_CASE("module zero_grad clears every parameter's gradient", "[autograd][nn]") {
  generator gen(12);
  block b(gen);
  backward(sum(b.forward(ones({2, 3}))));
  for (const auto& p : b.parameters()) REQUIRE(grad(p).defined());
  b.zero_grad();
  for (const auto& p : b.parameters()) CHECK((!grad(p).defined() || amax(abs(grad(p))).item() == 0.0));
}

TEST_CASE("mse loss matches hand-computed values for every reduction", "[autograd][nn]") {
  const tensor a = from_vector<double>({1, 2, 3});
  const tensor b = from_vector<double>({1, 0, 6});
  // squared errors 0, 4, 9
  CHECK(nn::mse_loss(a, b).item() == Approx(13.0 / 3.0));
  CHECK(nn::mse_loss(a, b, nn::reduction::sum).item() == Approx(13.0));
  CHECK(equal(nn::mse_loss(a, b, nn::reduction::none), from_vector<double>({0, 4, 9})));
  tensor x = from_vector<double>({0.5, -1, 2});
  set_requires_grad(x);
  CHECK(gradcheck([&](const tensor_list& in) { return nn::mse_loss(in[0], b); }, {x}));
  CHECK_THROWS_AS(nn::mse_loss(a, zeros({2}, dtype::float64)), error);
}

TEST_CASE("cross entropy matches hand-computed values and passes gradcheck", "[autograd][nn]") {
  // Row 0: equal logits over 2 classes -> ln 2. Row 1: logits (0, ln 3), class 1 -> -ln(3/4).
  const tensor logits = from_vector<double>({0, 0, 0, std::log(3.0)}, {2, 2});
  const tensor target = from_vector<std::int64_t>({0, 1});
  const tensor none = nn::cross_entropy_loss(logits, target, nn::reduction::none);
  CHECK(none.select(0, 0).item() == Approx(std::log(2.0)));
  CHECK(none.select(0, 1).item() == Approx(-std::log(0.75)));
  CHECK(nn::cross_entropy_loss(logits, target).item() == Approx((std::log(2.0) - std::log(0.75)) / 2));
  CHECK(nn::cross_entropy_loss(logits, target, nn::reduction::sum).item() ==
        Approx(std::log(2.0) - std::log(0.75)));
  generator gen(13);
  tensor x = randn({4, 3}, gen, dtype::float64);
  set_requires_grad(x);
  const tensor t = from_vector<std::int64_t>({2, 0, 1, 2});
  CHECK(gradcheck([&](const tensor_list& in) { return nn::cross_entropy_loss(in[0], t); }, {x}));
  CHECK_THROWS_MATCHES(nn::cross_entropy_loss(logits, from_vector<std::int64_t>({0, 2})), error,
                       Catch::Predicate<error>([](const error& e) { return e.code() == errc::index_out_of_range; }));
  CHECK_THROWS_MATCHES(nn::cross_entropy_loss(logits, from_vector<std::int32_t>({0, 1})), error,
                       Catch::Predicate<error>([](const error& e) { return e.code() == errc::dtype_mismatch; }));
}

TEST_CASE("activation modules apply their elementwise op", "[autograd][nn]") {
  const tensor x = from_vector<double>({-1, 0, 2});
  CHECK(equal(nn::relu().forward(x), from_vector<double>({0, 0, 2})));
  CHECK(allclose(nn::tanh().forward(x), troupe::tanh(x)));
  CHECK(nn::sigmoid().forward(x).select(0, 1).item() == Approx(0.5));
  CHECK(nn::gelu().forward(x).select(0, 2).item() == Approx(2.0 * 0.5 * (1 + std::erf(2.0 / std::sqrt(2.0)))));
}

TEST_CASE("dropout with a replayed generator state passes gradcheck", "[autograd][nn]") {
  generator gen(14);
  nn::dropout drop(0.3, gen);
  tensor x = randn({20}, gen, dtype::float64);
  set_requires_grad(x);
  const auto offset = gen.offset();
  // Rewinding the generator before each evaluation fixes the mask, so f is a function of x.
  CHECK(gradcheck(
      [&](const tensor_list& in) {
        gen.set_offset(offset);
        return drop.forward(in[0]);
      },
      {x}));
}

TEST_CASE("moving a module to its own device keeps parameter identity", "[autograd][nn]") {
  generator gen(15);
  block b(gen);
  const auto before = b.parameters();
  backward(sum(b.forward(ones({1, 3}))));
  b.to(cpu_device);
  const auto after = b.parameters();
  REQUIRE(after.size() == before.size());
  for (std::size_t i = 0; i < after.size(); ++i) {
    CHECK(after[i].is_same(before[i]));
    CHECK(after[i].is_cpu());
  }
}
