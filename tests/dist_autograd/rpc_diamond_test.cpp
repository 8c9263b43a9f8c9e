// Three-process tests of the distributed backward with automatic recording:
// - a diamond 1000 times, with no context left on any worker: worker0 fans x out to worker1 and
//   worker2 and joins their results;
// - a worker SIGKILLed in the middle of the backward.
#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <tuple>

#include <catch2/catch.hpp>

#include "dist_options.hpp"
#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/dist_autograd/container.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace std::chrono_literals;
using troupe::errc;
using troupe::tensor;
namespace da = troupe::dist_autograd;

namespace {

tensor make_w(int rank) {
  troupe::generator gen(static_cast<std::uint64_t>(100 + rank));
  return troupe::randn({3, 4}, gen);
}
tensor make_x() {
  troupe::generator gen(3);
  return troupe::randn({2, 3}, gen);
}

// worker1/worker2: y = x @ w_rank; with `die`, the backward of y SIGKILLs this process.
void branch_worker(int rank, troupe::test::port_pipe& pipe) {
  troupe::node n(troupe::test::dist_options(rank, 3, pipe.read()));
  auto owned = std::make_unique<da::container>(n);  // goes before the node does
  da::container& c = *owned;
  tensor w = make_w(rank);
  troupe::set_requires_grad(w);
  n.functions().add("fwd", [&](tensor x, bool die) {
    tensor y = troupe::matmul(x, w);
    if (die) troupe::register_hook(y, [](const tensor&) -> tensor { ::raise(SIGKILL); return {}; });
    return y;
  });
  // A chain: x -> x * x -> `to`'s fwd (which may die in its backward) -> z; returns z * z.
  n.functions().add("relay", [&n](tensor x, std::string to, bool die) {
    tensor z = troupe::rpc_sync<tensor>(n, to, "fwd", troupe::mul(x, x), die);
    return troupe::mul(z, z);
  });
  n.functions().add("wgrad", [&](std::uint64_t ctx) { return c.get_gradients(ctx).at(w); });
  n.functions().add("contexts", [&] { return static_cast<std::int64_t>(c.num_contexts()); });
  n.store().set("ready/" + std::to_string(rank), "1");
  const bool alone = n.store().get("done", 60s) == "immediate";  // a peer was killed: no barrier
  owned.reset();
  n.shutdown(alone ? troupe::shutdown_mode::immediate : troupe::shutdown_mode::graceful, 10s);
}

tensor branch(troupe::node& n, const tensor& x, const std::string& to, bool die) {
  return troupe::rpc_sync<tensor>(n, to, "fwd", x, die);
}

struct cluster {
  troupe::test::port_pipe pipe;
  troupe::spawn_context children = troupe::spawn(2, [this](int i) { branch_worker(i + 1, pipe); });
  troupe::node n{troupe::test::dist_options(0, 3, 0)};
  std::unique_ptr<da::container> owned = std::make_unique<da::container>(n);  // goes before the node
  da::container& c = *owned;
  cluster() {
    pipe.publish(n.port(), 2);
    n.store().wait({"ready/1", "ready/2"}, 10s);
  }
  std::int64_t contexts(const std::string& w) { return troupe::rpc_sync<std::int64_t>(n, w, "contexts"); }
  /// Lets the workers go; `graceful` waits for every rank (not when one was killed).
  void finish(troupe::shutdown_mode mode = troupe::shutdown_mode::graceful) {
    n.store().set("done", mode == troupe::shutdown_mode::immediate ? "immediate" : "graceful");
    owned.reset();
    n.shutdown(mode, 10s);
  }
};

}  // namespace

TEST_CASE("a diamond that fans out to two workers and joins gives the local gradients bitwise",
          "[dist_autograd]") {
  cluster cl;
  tensor xl = make_x(), w1 = make_w(1), w2 = make_w(2);
  for (tensor* t : {&xl, &w1, &w2}) troupe::set_requires_grad(*t);
  troupe::backward(troupe::sum(troupe::mul(troupe::matmul(xl, w1), troupe::matmul(xl, w2))));

  tensor x = make_x();
  troupe::set_requires_grad(x);
  for (int iter = 0; iter < 1000; ++iter) {
    da::context ctx(cl.c);
    tensor y1 = branch(cl.n, x, "worker1", false);
    tensor y2 = branch(cl.n, x, "worker2", false);
    cl.c.backward(ctx.id(), {troupe::sum(troupe::mul(y1, y2))});
    if (iter % 100 != 0) continue;  // full checks on every 100th iteration
    CHECK(troupe::equal(cl.c.get_gradients(ctx.id()).at(x), troupe::grad(xl)));
    CHECK(troupe::equal(troupe::rpc_sync<tensor>(cl.n, "worker1", "wgrad", ctx.id()), troupe::grad(w1)));
    CHECK(troupe::equal(troupe::rpc_sync<tensor>(cl.n, "worker2", "wgrad", ctx.id()), troupe::grad(w2)));
  }
  CHECK(cl.c.num_contexts() == 0);
  CHECK(cl.c.await_releases(10s));  // ~context does not wait for the workers' answers
  CHECK(cl.contexts("worker1") == 0);
  CHECK(cl.contexts("worker2") == 0);
  cl.finish();
  CHECK(cl.children.join(10s));
}

TEST_CASE("a worker SIGKILLed during the backward fails it with peer_lost naming the worker", "[dist_autograd]") {
  cluster cl;
  tensor x = make_x();
  troupe::set_requires_grad(x);
  {
    da::context ctx(cl.c);
    tensor y1 = branch(cl.n, x, "worker1", true);
    tensor y2 = branch(cl.n, x, "worker2", false);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      cl.c.backward(ctx.id(), {troupe::sum(troupe::mul(y1, y2))});
      FAIL("the backward succeeded without worker1");
    } catch (const troupe::error& e) {
      CHECK(e.code() == errc::peer_lost);
      CHECK_THAT(e.what(), Catch::Contains("worker1"));
    }
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  }
  CHECK(cl.c.num_contexts() == 0);
  CHECK(cl.contexts("worker2") == 0);
  cl.finish(troupe::shutdown_mode::immediate);
  CHECK_THROWS_AS(cl.children.join(10s), troupe::error);  // worker1 died by SIGKILL
}

TEST_CASE("a worker SIGKILLed two hops away during the backward fails it with peer_lost naming that worker within ~1 s",
          "[dist_autograd]") {
  cluster cl;
  tensor x = make_x();
  troupe::set_requires_grad(x);
  {
    da::context ctx(cl.c);
    tensor out = troupe::rpc_sync<tensor>(cl.n, "worker1", "relay", x, std::string("worker2"), true);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      cl.c.backward(ctx.id(), {troupe::sum(out)});
      FAIL("the backward succeeded without worker2");
    } catch (const troupe::error& e) {
      CHECK(e.code() == errc::peer_lost);
      CHECK_THAT(e.what(), Catch::Contains("worker2"));
    }
    CHECK(std::chrono::steady_clock::now() - t0 < 2s);
  }
  CHECK(cl.c.num_contexts() == 0);
  CHECK(cl.contexts("worker1") == 0);
  cl.finish(troupe::shutdown_mode::immediate);
  CHECK_THROWS_AS(cl.children.join(10s), troupe::error);  // worker2 died by SIGKILL
}
