// Optimizers: each update rule against numbers worked out from PyTorch's formulas, the
// functional step, state dicts, and a small MLP that must actually learn.
#include <catch2/catch.hpp>

#include <cmath>

#include "troupe/autograd/nn/activation.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/nn/loss.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/autograd/optim/adam.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/nn_ops.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace troupe;

namespace {

// Every case starts from p0 = (1, -2) and sees the gradients g1 = (0.5, -1), then g2 = (0.25, 0.5).
tensor start() {
  tensor p = from_vector<double>({1.0, -2.0});
  set_requires_grad(p);
  return p;
}
const std::vector<std::vector<double>> grads = {{0.5, -1.0}, {0.25, 0.5}};

// Runs two steps through .grad and checks the parameter after each against `expected`.
void check_two_steps(optim::optimizer& opt, tensor& p, const std::vector<std::vector<double>>& expected) {
  for (std::size_t s = 0; s < 2; ++s) {
    set_grad(p, from_vector<double>(grads[s]));
    opt.step();
    INFO("step " << s + 1);
    CHECK(p.select(0, 0).item() == Approx(expected[s][0]).epsilon(1e-12));
    CHECK(p.select(0, 1).item() == Approx(expected[s][1]).epsilon(1e-12));
  }
}

}  // namespace

TEST_CASE("plain sgd subtracts lr times the gradient", "[autograd][optim]") {
  tensor p = start();
  optim::sgd opt({p}, {.lr = 0.1});
  // p1 = p0 - 0.1 g1 = (0.95, -1.9); p2 = p1 - 0.1 g2 = (0.925, -1.95)
  check_two_steps(opt, p, {{0.95, -1.9}, {0.925, -1.95}});
}

TEST_CASE("sgd with momentum starts the buffer at the gradient and then accumulates", "[autograd][optim]") {
  tensor p = start();
  optim::sgd opt({p}, {.lr = 0.1, .momentum = 0.9});
  // buf1 = g1 = (0.5, -1), p1 = (0.95, -1.9)
  // buf2 = 0.9 buf1 + g2 = (0.7, -0.4), p2 = p1 - 0.1 buf2 = (0.88, -1.86)
  check_two_steps(opt, p, {{0.95, -1.9}, {0.88, -1.86}});
  CHECK(equal(opt.state(0).buffers.at("momentum_buffer"), from_vector<double>({0.7, -0.4})));
}

TEST_CASE("sgd dampening scales the gradient from the second step on", "[autograd][optim]") {
  tensor p = start();
  optim::sgd opt({p}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.5});
  // buf1 = g1 (no dampening at the first step), p1 = (0.95, -1.9)
  // buf2 = 0.9 (0.5, -1) + 0.5 (0.25, 0.5) = (0.575, -0.65), p2 = p1 - 0.1 buf2 = (0.8925, -1.835)
  check_two_steps(opt, p, {{0.95, -1.9}, {0.8925, -1.835}});
}

TEST_CASE("nesterov sgd with weight decay follows PyTorch's rule", "[autograd][optim]") {
  tensor p = start();
  optim::sgd opt({p}, {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true});
  // step 1: g = g1 + 0.1 p0 = (0.6, -1.2); buf = g; g' = g + 0.9 buf = (1.14, -2.28)
  //         p1 = p0 - 0.1 g' = (0.886, -1.772)
  // step 2: g = g2 + 0.1 p1 = (0.3386, 0.3228); buf = 0.9 (0.6, -1.2) + g = (0.8786, -0.7572)
  //         g' = g + 0.9 buf = (1.12934, -0.35868); p2 = p1 - 0.1 g' = (0.773066, -1.736132)
  check_two_steps(opt, p, {{0.886, -1.772}, {0.773066, -1.736132}});
}

TEST_CASE("sgd rejects nesterov without momentum and negative rates", "[autograd][optim]") {
  tensor p = start();
  CHECK_THROWS_AS(optim::sgd({p}, {.lr = 0.1, .nesterov = true}), error);
  CHECK_THROWS_AS(optim::sgd({p}, {.lr = -1}), error);
  CHECK_THROWS_AS(optim::sgd({p, p}, {.lr = 0.1}), error);
  CHECK_THROWS_AS(optim::sgd({zeros({2})}, {.lr = 0.1}), error);  // does not require grad
}

TEST_CASE("adam applies bias correction with eps outside the square root", "[autograd][optim]") {
  tensor p = start();
  optim::adam opt({p}, {.lr = 0.1});
  // step 1: m = 0.1 g1 = (0.05, -0.1), v = 0.001 g1^2 = (0.00025, 0.001)
  //   m^ = m / 0.1 = (0.5, -1), sqrt(v) / sqrt(0.001) = (0.5, 1)
  //   p1 = p0 - 0.1 * m^ / (that + 1e-8) = (0.900000002, -1.900000001)
  // step 2: m = 0.9 m + 0.1 g2 = (0.07, -0.04), v = 0.999 v + 0.001 g2^2 = (0.00031225, 0.001249)
  //   bias corrections 1 - 0.9^2 = 0.19 and 1 - 0.999^2 = 0.001999
  //   p2 = p1 - 0.1 / 0.19 * m / (sqrt(v) / sqrt(0.001999) + 1e-8) = (0.806782040477462, -1.8733662973709)
  check_two_steps(opt, p, {{0.900000002, -1.900000001}, {0.806782040477462, -1.8733662973709}});
  CHECK(opt.state(0).step == 2);
  CHECK(allclose(opt.state(0).buffers.at("exp_avg_sq"), from_vector<double>({0.00031225, 0.001249}), 1e-12, 0));
}

TEST_CASE("adam weight decay is added to the gradient", "[autograd][optim]") {
  tensor p = start();
  optim::adam opt({p}, {.lr = 0.1, .weight_decay = 0.1});
  // step 1: g = g1 + 0.1 p0 = (0.6, -1.2): m^ = g, sqrt(v^) = |g| -> p1 = p0 - 0.1 sign(g) (1 - eps/|g|)
  // step 2: g = g2 + 0.1 p1, then as plain adam (values from the same formulas)
  check_two_steps(opt, p, {{0.900000001666667, -1.90000000083333}, {0.80500976586132, -1.85374726464276}});
}

TEST_CASE("adamw decays the parameter before the adam step", "[autograd][optim]") {
  tensor p = start();
  optim::adamw opt({p}, {.lr = 0.1, .weight_decay = 0.1});
  // step 1: p <- p0 (1 - 0.1 * 0.1) = (0.99, -1.98), then the plain adam step 1 (-0.1 sign(g1)):
  //   p1 = (0.890000002, -1.880000001)
  // step 2: p <- 0.99 p1, then the plain adam step 2 (m, v as without decay):
  //   p2 = (0.787882040457462, -1.8345662973609)
  check_two_steps(opt, p, {{0.890000002, -1.880000001}, {0.787882040457462, -1.8345662973609}});
}

TEST_CASE("adamw defaults to a weight decay of 0.01", "[autograd][optim]") {
  tensor p = start();
  optim::adamw opt({p});
  CHECK(opt.state_dict().at("param_groups.0.weight_decay").item() == 0.01);
}

TEST_CASE("the functional step equals the .grad step and leaves .grad alone", "[autograd][optim]") {
  generator gen(1);
  tensor a = randn({3, 4}, gen), b = a.clone();
  set_requires_grad(a);
  set_requires_grad(b);
  optim::adam oa({a}, {.lr = 0.01, .weight_decay = 0.1});
  optim::adam ob({b}, {.lr = 0.01, .weight_decay = 0.1});
  for (int s = 0; s < 3; ++s) {
    const tensor g = randn({3, 4}, gen);
    set_grad(a, g.clone());
    oa.step();
    ob.step({b}, {g});
  }
  CHECK(equal(a, b));
  CHECK_FALSE(grad(b).defined());
  tensor stranger = zeros({3, 4});
  set_requires_grad(stranger);
  CHECK_THROWS_MATCHES(ob.step({stranger}, {zeros({3, 4})}), error,
                       Catch::Predicate<error>([](const error& e) { return e.code() == errc::bad_argument; }));
  CHECK_THROWS_MATCHES(ob.step({b}, {zeros({4, 3})}), error,
                       Catch::Predicate<error>([](const error& e) { return e.code() == errc::shape_mismatch; }));
}

TEST_CASE("an optimizer restored from its state dict continues identically", "[autograd][optim]") {
  generator gen(2);
  tensor a = randn({5}, gen), b = randn({5}, gen);
  set_requires_grad(a);
  set_requires_grad(b);
  optim::sgd first({a}, {.lr = 0.05, .momentum = 0.9, .nesterov = true});
  const auto g = [](int s) { return full({5}, 0.1 * (s + 1)); };
  for (int s = 0; s < 2; ++s) first.step({a}, {g(s)});
  {
    no_grad_guard guard;
    b.copy_(a);
  }
  optim::sgd second({b}, {.lr = 0.5});
  second.load_state_dict(first.state_dict());
  CHECK(second.lr() == 0.05);
  for (int s = 2; s < 4; ++s) {
    first.step({a}, {g(s)});
    second.step({b}, {g(s)});
  }
  CHECK(equal(a, b));
}

TEST_CASE("loading a mismatched optimizer state is rejected without changes", "[autograd][optim]") {
  tensor p = start();
  optim::adam opt({p}, {.lr = 0.1});
  set_grad(p, from_vector<double>({1, 1}));
  opt.step();
  auto sd = opt.state_dict();
  sd["state.0.exp_avg"] = zeros({3}, dtype::float64);
  CHECK_THROWS_MATCHES(opt.load_state_dict(sd), error, Catch::Predicate<error>([](const error& e) {
                         return e.code() == errc::shape_mismatch && e.message().find("state.0.exp_avg") != std::string::npos;
                       }));
  CHECK(opt.state(0).buffers.at("exp_avg").shape() == shape_t{2});
  sd = opt.state_dict();
  sd["state.1.step"] = scalar_tensor(1.0, dtype::float64);
  CHECK_THROWS_AS(opt.load_state_dict(sd), error);
}

TEST_CASE("a small MLP learns an XOR-like task", "[autograd][optim]") {
  // Four Gaussian clusters (std 0.15) at (+-1, +-1); the label is 1 when x*y > 0. No linear
  // model does better than chance, so a low loss needs the hidden layer. Chance-level cross
  // entropy for two balanced classes is ln 2 ~ 0.693; the clusters are separated by > 6 std, so
  // a fitted MLP reaches a loss near 0. We require < 0.05 after 300 full-batch Adam steps.
  generator gen(42);
  const std::int64_t n = 256;
  const tensor signs = randint(0, 2, {n, 2}, gen).to(dtype::float32) * 2.0 - 1.0;
  const tensor x = signs + randn({n, 2}, gen, {}, 0.0, 0.15);
  const tensor y = gt(signs.select(1, 0) * signs.select(1, 1), 0.0).to(dtype::int64);
  nn::sequential mlp(std::make_shared<nn::linear>(2, 16, gen), std::make_shared<nn::tanh>(),
                     std::make_shared<nn::linear>(16, 2, gen));
  optim::adam opt(mlp.parameters(), {.lr = 0.05});
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    opt.zero_grad();
    const tensor loss = nn::cross_entropy_loss(mlp.forward(x), y);
    backward(loss);
    opt.step();
    if (step == 0) first = loss.item();
    last = loss.item();
  }
  CHECK(first > 0.5);  // it started near chance
  CHECK(last < 0.05);
  const tensor pred = argmax(mlp.forward(x), 1);
  CHECK(sum(eq(pred, y).to(dtype::float64)).item() >= 0.99 * n);
}

TEST_CASE("parameters without a gradient are skipped by both step forms", "[autograd][optim]") {
  tensor a = start(), b = start();
  optim::sgd opt({a, b}, {.lr = 0.1, .momentum = 0.9});
  set_grad(a, from_vector<double>({1, 1}));
  opt.step();  // b has no .grad
  CHECK(equal(a, from_vector<double>({0.9, -2.1})));
  CHECK(equal(b, from_vector<double>({1.0, -2.0})));
  CHECK(opt.state(1).buffers.empty());
  opt.step({a, b}, {tensor(), from_vector<double>({1, 1})});
  CHECK(equal(a, from_vector<double>({0.9, -2.1})));
  CHECK(equal(b, from_vector<double>({0.9, -2.1})));
  opt.zero_grad();
  CHECK((!grad(a).defined() || amax(abs(grad(a))).item() == 0.0));
}
