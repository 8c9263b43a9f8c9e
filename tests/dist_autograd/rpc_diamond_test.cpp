// Three-process tests of the distributed backward: a diamond (worker0 fans x out to worker1 and
// worker2, joins their results), and a worker SIGKILLed in the middle of the backward.
#include <signal.h>

#include <string>
#include <tuple>

#include <catch2/catch.hpp>

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

using fwd_result = std::tuple<std::uint64_t, tensor>;

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
  troupe::node n(troupe::test::test_options(rank, 3, pipe.read()));
  da::container c(n);
  tensor w = make_w(rank);
  troupe::set_requires_grad(w);
  n.functions().add("fwd", [&](std::uint64_t ctx, std::uint64_t msg, tensor x, bool die, std::string from) {
    tensor y = troupe::matmul(c.record_recv(ctx, msg, from, {x})[0], w);
    if (die) troupe::register_hook(y, [](const tensor&) -> tensor { ::raise(SIGKILL); return {}; });
    return fwd_result{c.record_send(ctx, {y}, from), y};
  });
  // A chain: x (from worker0) -> x * x -> `to`'s fwd -> z; returns z * z to worker0.
  n.functions().add("relay", [&](std::uint64_t ctx, std::uint64_t msg, tensor x, std::string to) {
    tensor xr = c.record_recv(ctx, msg, "worker0", {x})[0];
    tensor y = troupe::mul(xr, xr);
    const std::string me = "worker" + std::to_string(rank);
    auto [back, z] = troupe::rpc_sync<fwd_result>(n, to, "fwd", ctx, c.record_send(ctx, {y}, to), y, false, me);
    tensor zr = c.record_recv(ctx, back, to, {z})[0];
    tensor out = troupe::mul(zr, zr);
    return fwd_result{c.record_send(ctx, {out}, "worker0"), out};
  });
  n.functions().add("wgrad", [&](std::uint64_t ctx) { return c.get_gradients(ctx).at(w); });
  n.functions().add("contexts", [&] { return static_cast<std::int64_t>(c.num_contexts()); });
  n.store().set("ready/" + std::to_string(rank), "1");
  const bool alone = n.store().get("done", 60s) == "immediate";  // a peer was killed: no barrier
  n.shutdown(alone ? troupe::shutdown_mode::immediate : troupe::shutdown_mode::graceful, 10s);
}

tensor branch(troupe::node& n, da::container& c, da::context_id ctx, const tensor& x, const std::string& to, bool die) {
  auto [back, y] =
      troupe::rpc_sync<fwd_result>(n, to, "fwd", ctx, c.record_send(ctx, {x}, to), x, die, std::string("worker0"));
  return c.record_recv(ctx, back, to, {y})[0];
}

struct cluster {
  troupe::test::port_pipe pipe;
  troupe::spawn_context children = troupe::spawn(2, [this](int i) { branch_worker(i + 1, pipe); });
  troupe::node n{troupe::test::test_options(0, 3, 0)};
  da::container c{n};
  cluster() {
    pipe.publish(n.port(), 2);
    n.store().wait({"ready/1", "ready/2"}, 10s);
  }
  std::int64_t contexts(const std::string& w) { return troupe::rpc_sync<std::int64_t>(n, w, "contexts"); }
  /// Lets the workers go; `graceful` waits for every rank (not when one was killed).
  void finish(troupe::shutdown_mode mode = troupe::shutdown_mode::graceful) {
    n.store().set("done", mode == troupe::shutdown_mode::immediate ? "immediate" : "graceful");
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
    tensor y1 = branch(cl.n, cl.c, ctx.id(), x, "worker1", false);
    tensor y2 = branch(cl.n, cl.c, ctx.id(), x, "worker2", false);
    cl.c.backward(ctx.id(), {troupe::sum(troupe::mul(y1, y2))});
    if (iter % 100 != 0) continue;  // full checks on every 100th iteration
    CHECK(troupe::equal(cl.c.get_gradients(ctx.id()).at(x), troupe::grad(xl)));
    CHECK(troupe::equal(troupe::rpc_sync<tensor>(cl.n, "worker1", "wgrad", ctx.id()), troupe::grad(w1)));
    CHECK(troupe::equal(troupe::rpc_sync<tensor>(cl.n, "worker2", "wgrad", ctx.id()), troupe::grad(w2)));
  }
  CHECK(cl.c.num_contexts() == 0);
  CHECK(cl.contexts("worker1") == 0);
  CHECK(cl.contexts("worker2") == 0);
  cl.finish();
  CHECK(cl.children.join(10s));
}

TEST_CASE("a chain worker0 -> worker1 -> worker2 -> worker1 -> worker0 gives the local gradients bitwise",
          "[dist_autograd]") {
  cluster cl;
  tensor xl = make_x(), w2 = make_w(2);
  troupe::set_requires_grad(xl);
  troupe::set_requires_grad(w2);
  tensor zl = troupe::matmul(troupe::mul(xl, xl), w2);
  troupe::backward(troupe::sum(troupe::mul(zl, zl)));

  tensor x = make_x();
  troupe::set_requires_grad(x);
  for (int iter = 0; iter < 20; ++iter) {
    da::context ctx(cl.c);
    auto [back, out] = troupe::rpc_sync<fwd_result>(cl.n, "worker1", "relay", ctx.id(),
                                                    cl.c.record_send(ctx.id(), {x}, "worker1"), x, std::string("worker2"));
    cl.c.backward(ctx.id(), {troupe::sum(cl.c.record_recv(ctx.id(), back, "worker1", {out})[0])});
    CHECK(troupe::equal(cl.c.get_gradients(ctx.id()).at(x), troupe::grad(xl)));
    CHECK(troupe::equal(troupe::rpc_sync<tensor>(cl.n, "worker2", "wgrad", ctx.id()), troupe::grad(w2)));
  }
  CHECK(cl.c.num_contexts() == 0);
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
    tensor y1 = branch(cl.n, cl.c, ctx.id(), x, "worker1", true);
    tensor y2 = branch(cl.n, cl.c, ctx.id(), x, "worker2", false);
    try {
      cl.c.backward(ctx.id(), {troupe::sum(troupe::mul(y1, y2))});
      FAIL("the backward succeeded without worker1");
    } catch (const troupe::error& e) {
      CHECK(e.code() == errc::peer_lost);
      CHECK_THAT(e.what(), Catch::Contains("worker1"));
    }
  }
  CHECK(cl.c.num_contexts() == 0);
  CHECK(cl.contexts("worker2") == 0);
  cl.finish(troupe::shutdown_mode::immediate);
  CHECK_THROWS_AS(cl.children.join(10s), troupe::error);  // worker1 died by SIGKILL
}
