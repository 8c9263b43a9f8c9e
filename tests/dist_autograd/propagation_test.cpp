// PropagateGradients driven by the context actors (Note [context actor]). A chain that visits
// every worker twice runs on two executor threads per worker: no executor thread waits for
// another worker. A propagation whose request or reply never gets through fails the backward
// with timeout, bounded, and releases the contexts.
#include <atomic>
#include <chrono>

#include <catch2/catch.hpp>

#include "dist_autograd/dist_job.hpp"
#include "troupe/actors/fault_plan.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace std::chrono_literals;
using troupe::errc;
using troupe::tensor;
namespace da = troupe::dist_autograd;

namespace {

tensor leaf(std::uint64_t seed) {
  troupe::generator gen(seed);
  tensor t = troupe::randn({2, 3}, gen);
  troupe::set_requires_grad(t);
  return t;
}

/// worker0 -> worker1 "f" -> worker2 "g" -> worker0 "h" -> worker1 "k".
/// Every worker serves a call while one of its own is still open, in the forward and in the
/// backward.
struct chain {
  troupe::test::small_job job;
  tensor a1 = leaf(21), a2 = leaf(22);

  explicit chain(int threads) : job(3, threads) {
    auto& n0 = job.at(0);
    auto& n1 = job.at(1);
    auto& n2 = job.at(2);
    n1.functions().add("f", [&n1](tensor x) {
      tensor y = troupe::mul(x, x);
      return troupe::mul(troupe::rpc_sync<tensor>(n1, "worker2", "g", y), y);
    });
    n2.functions().add("g", [this, &n2](tensor y) {
      tensor u = troupe::mul(y, a2);
      return troupe::add(troupe::rpc_sync<tensor>(n2, "worker0", "h", u), u);
    });
    n0.functions().add("h", [&n0](tensor u) {
      tensor t = troupe::mul(u, u);
      return troupe::mul(troupe::rpc_sync<tensor>(n0, "worker1", "k", t), t);
    });
    n1.functions().add("k", [this](tensor t) { return troupe::mul(t, a1); });
  }
};

/// The same ops in the same order on one worker; the leaves' .grad hold the reference.
struct chain_reference {
  tensor x = leaf(5), a1 = leaf(21), a2 = leaf(22);
  chain_reference() {
    tensor y = troupe::mul(x, x);
    tensor u = troupe::mul(y, a2);
    tensor t = troupe::mul(u, u);
    tensor g = troupe::add(troupe::mul(troupe::mul(t, a1), t), u);
    troupe::backward(troupe::sum(troupe::mul(g, y)));
  }
};

}  // namespace

TEST_CASE("a chain worker0 -> 1 -> 2 -> 0 -> 1 runs its distributed backward on two executor threads per worker",
          "[dist_autograd]") {
  chain c(2);
  const chain_reference ref;
  tensor x = leaf(5);
  for (int iter = 0; iter < 10; ++iter) {
    da::context ctx(c.job[0]);
    tensor out = troupe::rpc_sync<tensor>(c.job.at(0), "worker1", "f", x);
    c.job[0].backward(ctx.id(), {troupe::sum(out)});
    // u and y each get three gradient terms whose summation order differs from the local engine's.
    CHECK(troupe::allclose(c.job[0].get_gradients(ctx.id()).at(x), troupe::grad(ref.x), 1e-6, 1e-6));
    CHECK(troupe::allclose(c.job[1].get_gradients(ctx.id()).at(c.a1), troupe::grad(ref.a1), 1e-6, 1e-6));
    CHECK(troupe::allclose(c.job[2].get_gradients(ctx.id()).at(c.a2), troupe::grad(ref.a2), 1e-6, 1e-6));
  }
  CHECK(c.job.contexts() == 0);
}

TEST_CASE("a propagation that never gets through fails the backward with timeout after its attempts and releases the contexts",
          "[dist_autograd][fault]") {
  da::container_options o;
  o.propagate_timeout = 100ms;
  o.attempts = 3;
  o.backoff = 5ms;
  troupe::test::dist_job job(2, o);
  tensor w = leaf(11);
  job.at(1).functions().add("fwd", [&w](tensor x) { return troupe::mul(x, w); });
  auto injector = std::make_shared<troupe::fault_injector>(
      troupe::fault_plan::parse("seed 1\nrule actor:troupe.dist_autograd.propagate_request drop=1\n"));
  tensor x = leaf(5);
  {
    da::context ctx(job[0]);
    tensor y = troupe::rpc_sync<tensor>(job.at(0), "worker1", "fwd", x);
    job.c.hook->use(injector);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      job[0].backward(ctx.id(), {troupe::sum(y)});
      FAIL("the backward succeeded without its propagation");
    } catch (const troupe::error& e) {
      CHECK(e.code() == errc::timeout);
      CHECK_THAT(e.what(), Catch::Contains("worker1"));
      CHECK_THAT(e.what(), Catch::Contains("timed out 3 time(s)"));
    }
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);  // 3 attempts of 100 ms and the backoffs
    job.c.hook->use(nullptr);
    CHECK(job[1].num_contexts() == 0);  // released at once by the failed backward
  }
  CHECK(job.contexts() == 0);
  CHECK(injector->counters().dropped_requests == 3);
}

TEST_CASE("a propagation whose replies are all lost is retried, runs its send function once, and fails with timeout",
          "[dist_autograd][fault]") {
  da::container_options o;
  o.propagate_timeout = 100ms;
  o.attempts = 3;
  o.backoff = 5ms;
  troupe::test::dist_job job(2, o);
  tensor w = leaf(11);
  std::atomic<int> runs{0};
  job.at(1).functions().add("fwd", [&w, &runs](tensor x) {
    tensor y = troupe::mul(x, w);
    troupe::register_hook(y, [&runs](const tensor& g) {
      ++runs;
      return g;
    });
    return y;
  });
  auto injector = std::make_shared<troupe::fault_injector>(
      troupe::fault_plan::parse("seed 1\nrule actor:troupe.dist_autograd.propagate_reply drop=1\n"));
  tensor x = leaf(5).detach();  // no gradient for x: one propagation only, to worker1
  {
    da::context ctx(job[0]);
    tensor y = troupe::rpc_sync<tensor>(job.at(0), "worker1", "fwd", x);
    job.c.hook->use(injector);
    try {
      job[0].backward(ctx.id(), {troupe::sum(y)});
      FAIL("the backward succeeded without a reply");
    } catch (const troupe::error& e) {
      CHECK(e.code() == errc::timeout);
      CHECK_THAT(e.what(), Catch::Contains("worker1"));
      CHECK_THAT(e.what(), Catch::Contains("timed out 3 time(s)"));
    }
    job.c.hook->use(nullptr);
    CHECK(runs.load() == 1);  // the retries found the first attempt's outcome on worker1
    CHECK(job[1].num_contexts() == 0);
  }
  CHECK(job.contexts() == 0);
  CHECK(injector->counters().dropped_requests == 3);  // actor messages: the replies count as requests
}
