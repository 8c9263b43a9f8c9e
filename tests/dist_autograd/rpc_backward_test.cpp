// Multi-process tests of the distributed backward: a forward split over two workers through
// rpc_sync (x: worker0 -> worker1, y: worker1 -> worker0), errors, and release on every worker.
#include <atomic>
#include <stdexcept>
#include <thread>
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

tensor make_w() {
  troupe::generator gen(11);
  return troupe::randn({3, 4}, gen);
}
tensor make_x() {
  troupe::generator gen(5);
  return troupe::randn({2, 3}, gen);
}

// worker1: holds w; "fwd" computes y = x @ w inside the caller's context (fail = a hook that
// throws in backward); "wgrad" returns w's gradient in a context; "contexts" counts contexts.
void worker1(troupe::test::port_pipe& pipe) {
  troupe::node n(troupe::test::test_options(1, 2, pipe.read()));
  da::container c(n);
  tensor w = make_w();
  troupe::set_requires_grad(w);
  n.functions().add("fwd", [&](std::uint64_t ctx, std::uint64_t msg, tensor x, bool fail) {
    tensor xr = c.record_recv(ctx, msg, "worker0", {x})[0];
    tensor y = troupe::matmul(xr, w);
    if (fail) troupe::register_hook(y, [](const tensor&) -> tensor { throw std::runtime_error("boom in worker1"); });
    const std::uint64_t back = c.record_send(ctx, {y}, "worker0");
    return fwd_result{back, y};
  });
  n.functions().add("wgrad", [&](std::uint64_t ctx) { return c.get_gradients(ctx).at(w); });
  n.functions().add("contexts", [&] { return static_cast<std::int64_t>(c.num_contexts()); });
  n.store().set("ready/1", "1");
  n.store().get("done", 60s);
  n.shutdown(troupe::shutdown_mode::graceful, 10s);
}

// worker0's part of the forward: x -> worker1 -> y; returns sum(y * y).
tensor distributed_loss(troupe::node& n, da::container& c, da::context_id ctx, const tensor& x, bool fail) {
  const auto msg = c.record_send(ctx, {x}, "worker1");
  auto [back, y] = troupe::rpc_sync<fwd_result>(n, "worker1", "fwd", ctx, msg, x, fail);
  tensor yr = c.record_recv(ctx, back, "worker1", {y})[0];
  return troupe::sum(troupe::mul(yr, yr));
}

std::int64_t remote_contexts(troupe::node& n) { return troupe::rpc_sync<std::int64_t>(n, "worker1", "contexts"); }

// This process as worker0 with worker1 forked beside it (spawned before the node: fork safety).
struct two_workers {
  troupe::test::port_pipe pipe;
  troupe::spawn_context children = troupe::spawn(1, [this](int) { worker1(pipe); });
  troupe::node n{troupe::test::test_options(0, 2, 0)};
  da::container c{n};

  two_workers() {
    pipe.publish(n.port(), 1);
    n.store().wait({"ready/1"}, 10s);
  }
  /// Lets worker1 finish, shuts down gracefully; true if worker1 exited cleanly.
  bool finish() {
    n.store().set("done", "1");
    n.shutdown(troupe::shutdown_mode::graceful, 10s);
    return children.join(10s);
  }
};

// The same computation done locally: leaves x and w whose .grad holds the reference gradients.
std::pair<tensor, tensor> local_reference() {
  tensor xl = make_x(), wl = make_w();
  troupe::set_requires_grad(xl);
  troupe::set_requires_grad(wl);
  tensor yl = troupe::matmul(xl, wl);
  troupe::backward(troupe::sum(troupe::mul(yl, yl)));
  return {xl, wl};
}

}  // namespace

TEST_CASE("gradients of a forward split over two workers equal the local ones bitwise and contexts are released",
          "[dist_autograd]") {
  two_workers job;
  auto& n = job.n;
  auto& c = job.c;

  const auto [xl, wl] = local_reference();

  tensor x = make_x();
  troupe::set_requires_grad(x);
  for (int iter = 0; iter < 20; ++iter) {
    da::context ctx(c);
    c.backward(ctx.id(), {distributed_loss(n, c, ctx.id(), x, false)});
    CHECK(troupe::equal(c.get_gradients(ctx.id()).at(x), troupe::grad(xl)));
    CHECK(troupe::equal(troupe::rpc_sync<tensor>(n, "worker1", "wgrad", ctx.id()), troupe::grad(wl)));
    CHECK_FALSE(troupe::grad(x).defined());
    CHECK(remote_contexts(n) == 1);
  }
  CHECK(c.num_contexts() == 0);
  CHECK(remote_contexts(n) == 0);
  CHECK(job.finish());
}

TEST_CASE("an exception in a remote backward fails the backward at the caller with the remote text",
          "[dist_autograd]") {
  two_workers job;
  auto& n = job.n;
  auto& c = job.c;
  tensor x = make_x();
  troupe::set_requires_grad(x);
  {
    da::context ctx(c);
    tensor loss = distributed_loss(n, c, ctx.id(), x, true);
    try {
      c.backward(ctx.id(), {loss});
      FAIL("the remote exception did not reach the caller");
    } catch (const troupe::error& e) {
      CHECK(e.code() == errc::remote_exception);
      CHECK_THAT(e.what(), Catch::Contains("boom in worker1"));
    }
    CHECK_FALSE(c.get_gradients(ctx.id()).contains(x));
  }
  CHECK(remote_contexts(n) == 0);
  CHECK(job.finish());
}

TEST_CASE("retain_graph allows a second distributed backward and concurrent contexts do not mix gradients",
          "[dist_autograd]") {
  two_workers job;
  auto& n = job.n;
  auto& c = job.c;
  const auto [xl, wl] = local_reference();
  tensor x = make_x();
  troupe::set_requires_grad(x);
  {
    da::context ctx(c);
    tensor loss = distributed_loss(n, c, ctx.id(), x, false);
    c.backward(ctx.id(), {loss}, /*retain_graph=*/true);
    c.backward(ctx.id(), {loss});
    CHECK(troupe::equal(c.get_gradients(ctx.id()).at(x), troupe::mul(troupe::grad(xl), 2.0)));
    CHECK(troupe::equal(troupe::rpc_sync<tensor>(n, "worker1", "wgrad", ctx.id()), troupe::mul(troupe::grad(wl), 2.0)));
  }
  // Two threads, one context each, the same leaf: each context holds exactly one pass's gradients.
  std::atomic<int> good{0};
  auto one = [&] {
    for (int i = 0; i < 50; ++i) {
      da::context ctx(c);
      c.backward(ctx.id(), {distributed_loss(n, c, ctx.id(), x, false)});
      const bool ok = troupe::equal(c.get_gradients(ctx.id()).at(x), troupe::grad(xl)) &&
                      troupe::equal(troupe::rpc_sync<tensor>(n, "worker1", "wgrad", ctx.id()), troupe::grad(wl));
      if (ok) good.fetch_add(1);
    }
  };
  std::thread t1(one), t2(one);
  t1.join();
  t2.join();
  CHECK(good.load() == 100);
  CHECK(c.num_contexts() == 0);
  CHECK(remote_contexts(n) == 0);
  CHECK(job.finish());
}
