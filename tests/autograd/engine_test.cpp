// The local backward engine: order, dependencies, retain_graph, engine::grad, errors, threads.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <thread>

#include "autograd/autograd_test_util.hpp"
#include "troupe/autograd/engine.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace troupe;
using troupe::test::leaf_of;
using troupe::test::values;

TEST_CASE("a diamond graph gets the sum of both paths and runs nodes after all their inputs", "[autograd][engine]") {
  tensor x = leaf_of({0.5, -1.0, 2.0}, {3});
  tensor a = x * 2.0;
  tensor b = exp(a);
  tensor c = a * 3.0;
  tensor d = b + c;
  std::vector<std::string> order;
  std::vector<hook_handle> hs;
  for (const auto& t : {d, c, b, a})
    hs.push_back(grad_fn(t)->register_pre_hook([&, n = grad_fn(t).get()](tensor_list&) {
      order.push_back(n == grad_fn(a).get() ? "a" : n == grad_fn(b).get() ? "b" : n == grad_fn(c).get() ? "c" : "d");
    }));
  backward(sum(d));
  // d first; b and c are both ready after d: c was created later, so it runs first (PyTorch's
  // order); a only after both.
  CHECK(order == std::vector<std::string>{"d", "c", "b", "a"});
  const auto g = values(grad(x));
  const std::vector<double> xs{0.5, -1.0, 2.0};
  for (std::size_t i = 0; i < 3; ++i) CHECK(g[i] == Approx(2 * (std::exp(2 * xs[i]) + 3)));
}

TEST_CASE("a leaf used several times gets the sum of its gradients", "[autograd][engine]") {
  tensor x = leaf_of({1.5, -2.0}, {2});
  backward(sum(x * x + x));
  CHECK(values(grad(x)) == std::vector<double>{4.0, -3.0});
  int fired = 0;
  auto h = register_post_accumulate_grad_hook(x, [&](const tensor&) { ++fired; });
  zero_grad(x);
  backward(sum(x + x + x));
  CHECK(fired == 1);
  CHECK(values(grad(x)) == std::vector<double>{3.0, 3.0});
}

TEST_CASE("several roots sharing a subgraph are differentiated in one pass", "[autograd][engine]") {
  tensor x = leaf_of({0.1, 0.2}, {2});
  tensor s = exp(x);
  engine().backward({sum(s), sum(s * s)}, {});
  const auto g = values(grad(x));
  CHECK(g[0] == Approx(std::exp(0.1) + 2 * std::exp(0.2)));
  CHECK(g[1] == Approx(std::exp(0.2) + 2 * std::exp(0.4)));
}

TEST_CASE("a second backward without retain_graph is a clear error naming the op", "[autograd][engine]") {
  tensor x = leaf_of({1.0, 2.0}, {2});
  tensor y = sum(x * x);
  backward(y);
  try {
    backward(y);
    FAIL("second backward did not throw");
  } catch (const error& e) {
    CHECK(e.code() == errc::autograd_error);
    CHECK_THAT(e.message(), Catch::Contains("second time") && Catch::Contains("mul") &&
                                Catch::Contains("retain_graph"));
  }
}

TEST_CASE("retain_graph lets a graph run twice and the gradients accumulate", "[autograd][engine]") {
  tensor x = leaf_of({1.0, -3.0}, {2});
  tensor y = sum(x * x);
  backward(y, {}, true);
  CHECK(values(grad(x)) == std::vector<double>{2.0, -6.0});
  backward(y, {}, true);
  CHECK(values(grad(x)) == std::vector<double>{4.0, -12.0});
}

TEST_CASE("nothing is recorded under no_grad", "[autograd][engine]") {
  tensor x = leaf_of({1.0}, {1});
  tensor y;
  {
    no_grad_guard ng;
    y = exp(x * 2.0);
  }
  CHECK_FALSE(y.requires_grad());
  CHECK(is_leaf(y));
  CHECK(grad_fn(y) == nullptr);
  CHECK_THROWS_MATCHES(backward(sum(y)), error, Catch::Predicate<error>([](const error& e) {
                         return e.code() == errc::autograd_error;
                       }));
  tensor z = x * 2.0;
  CHECK(z.requires_grad());
  REQUIRE(grad_fn(z) != nullptr);
  CHECK(grad_fn(z)->name() == "mul");
}

TEST_CASE("a non-scalar root needs an explicit gradient of its shape", "[autograd][engine]") {
  tensor x = leaf_of({1.0, 2.0}, {2});
  tensor y = x * 3.0;
  CHECK_THROWS_AS(backward(y), error);
  CHECK_THROWS_AS(backward(y, ones({3}, dtype::float64)), error);
  backward(y, from_vector<double>({1.0, 10.0}));
  CHECK(values(grad(x)) == std::vector<double>{3.0, 30.0});
}

TEST_CASE("engine::grad returns gradients without touching .grad", "[autograd][engine]") {
  tensor x = leaf_of({1.0, 2.0}, {2});
  tensor w = leaf_of({3.0, -4.0}, {2});
  tensor h = x * w;
  tensor y = sum(h * h);
  const auto gs = engine().grad({y}, {x, h}, {}, true);
  REQUIRE(gs.size() == 2);
  CHECK(values(gs[0]) == std::vector<double>{18.0, 64.0});  // 2 x w^2
  CHECK(values(gs[1]) == std::vector<double>{6.0, -16.0});  // 2 h
  CHECK_FALSE(grad(x).defined());
  CHECK_FALSE(grad(w).defined());
  // An input the output does not depend on gets an undefined gradient.
  tensor unused = leaf_of({1.0}, {1});
  const auto g2 = engine().grad({y}, {unused, w});
  CHECK_FALSE(g2[0].defined());
  CHECK(values(g2[1]) == std::vector<double>{6.0, -32.0});  // 2 w x^2
  CHECK_THROWS_AS(engine().grad({sum(x * 1.0)}, {ones({2})}), error);
}

TEST_CASE("a graph task that captures leaves hands their gradients over instead of .grad",
          "[autograd][engine]") {
  tensor x = leaf_of({2.0}, {1});
  tensor y = sum(x * x * x);
  graph_task task;
  task.roots = {{edge{grad_fn(y), 0}, ones({}, dtype::float64)}};
  task.capture_leaves = true;
  std::vector<double> got;
  task.capture = [&](const edge& e, const tensor& g) {
    CHECK(e.fn == grad_accumulator(x));
    got = values(g);
  };
  engine().execute(task);
  CHECK(got == std::vector<double>{12.0});
  CHECK_FALSE(grad(x).defined());
}

TEST_CASE("an exception in a backward function reaches the caller with the node's name", "[autograd][engine]") {
  tensor x = leaf_of({1.0}, {1});
  tensor a = x * 2.0;
  auto fn = std::make_shared<test::lambda_node>("exploding_op", edge_list{gradient_edge(a)}, 1,
                                                [](tensor_list&&) -> tensor_list { throw std::runtime_error("boom"); });
  tensor out = a.detach().clone();
  test::attach(out, fn);
  try {
    backward(sum(out));
    FAIL("no exception");
  } catch (const error& e) {
    CHECK_THAT(e.message(), Catch::Contains("exploding_op") && Catch::Contains("boom"));
  }
  CHECK_FALSE(grad(x).defined());
  auto fn2 = std::make_shared<test::lambda_node>("bad_arity", edge_list{gradient_edge(a)}, 1,
                                                 [](tensor_list&&) { return tensor_list{}; });
  tensor out2 = a.detach().clone();
  test::attach(out2, fn2);
  CHECK_THROWS_WITH(backward(sum(out2)), Catch::Contains("bad_arity"));
}

TEST_CASE("a custom node's gradients flow on to the graph before it", "[autograd][engine]") {
  tensor x = leaf_of({1.0, 2.0}, {2});
  tensor a = x * 2.0;
  auto fn = std::make_shared<test::lambda_node>("times_ten", edge_list{gradient_edge(a)}, 1,
                                                [](tensor_list&& g) { return tensor_list{g[0] * 10.0}; });
  tensor out = a.detach().clone();
  test::attach(out, fn);
  backward(sum(out));
  CHECK(values(grad(x)) == std::vector<double>{20.0, 20.0});
}

TEST_CASE("two threads run backward on separate graphs concurrently with correct gradients",
          "[autograd][engine]") {
  const engine shared;  // the same engine from both threads; it holds no state
  std::atomic<int> wrong{0};
  auto worker = [&](double k) {
    for (int it = 0; it < 100; ++it) {
      tensor x = leaf_of({k, k + 1, static_cast<double>(it)}, {3});
      tensor y = sum(exp(x * 0.1) * x + x * k);
      if (it % 2) shared.backward({y}, {});
      else backward(y);
      const auto g = values(grad(x));
      const std::vector<double> xs{k, k + 1, static_cast<double>(it)};
      for (std::size_t i = 0; i < 3; ++i) {
        const double expect = std::exp(0.1 * xs[i]) * (1 + 0.1 * xs[i]) + k;
        if (std::abs(g[i] - expect) > 1e-9 * std::abs(expect)) ++wrong;
      }
    }
  };
  std::thread t1(worker, 1.0), t2(worker, -2.0);
  t1.join();
  t2.join();
  CHECK(wrong == 0);
}

TEST_CASE("backward frees saved tensors and the graph dies with its tensors", "[autograd][engine]") {
  tensor x = leaf_of({1.0, 2.0}, {2});
  std::weak_ptr<grad_node> fn;
  std::weak_ptr<storage> saved_storage;
  {
    tensor a = x * 3.0;
    tensor b = a * a;  // saves a
    saved_storage = a.storage();
    fn = grad_fn(b);
    a = tensor();
    CHECK_FALSE(saved_storage.expired());  // the saved alias keeps a's data alive
    backward(sum(b));
    CHECK(saved_storage.expired());  // freed by the backward without retain_graph
    CHECK_FALSE(fn.expired());       // b still holds its history
  }
  CHECK(fn.expired());
  CHECK(values(grad(x)) == std::vector<double>{18.0, 36.0});
}

TEST_CASE("a chain of half a million nodes is differentiated and freed without deep recursion",
          "[autograd][engine]") {
  tensor x = leaf_of({1.0}, {1});
  tensor out = x * 1.0;
  const int n = 500000;
  for (int i = 0; i < n; ++i) {
    auto fn = std::make_shared<test::lambda_node>("pass", edge_list{gradient_edge(out)}, 1,
                                                  [](tensor_list&& g) { return std::move(g); });
    out = out.detach();
    test::attach(out, fn);
  }
  backward(sum(out * 2.0));
  CHECK(values(grad(x)) == std::vector<double>{2.0});
  out = tensor();  // destroys the chain; a recursive destruction would overflow the stack
  CHECK(x.requires_grad());
}
