// FAST mode (Note [FAST mode backward]): a chain over three workers, a node shared by two send
// functions runs once per pass, and PropagateGradients / release survive the fault plan.
#include <atomic>
#include <stdexcept>
#include <string>

#include <catch2/catch.hpp>

#include "dist_autograd/dist_job.hpp"
#include "troupe/actors/fault_plan.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace std::chrono_literals;
using troupe::tensor;
namespace da = troupe::dist_autograd;

namespace {

tensor leaf(std::uint64_t seed, troupe::shape_t shape) {
  troupe::generator gen(seed);
  tensor t = troupe::randn(shape, gen);
  troupe::set_requires_grad(t);
  return t;
}

/// worker1 "fan": h = x @ w; a = square(h) on worker0, b = square(h) on worker0 (two sends of
/// the same h); returns a + b. `h_runs` counts the backward runs of h's node (a tensor hook).
/// worker1 "relay": y = x * x -> worker2 "fwd2" (y @ w2) -> z; returns z * z.
struct three_workers {
  troupe::test::dist_job job;
  tensor w = leaf(11, {3, 4}), w2 = leaf(12, {3, 4});
  std::atomic<int> h_runs{0};

  explicit three_workers(da::container_options o = {}) : job(3, o) {
    auto& n1 = job.at(1);
    job.at(0).functions().add("square", [](tensor h) { return troupe::mul(h, h); });
    n1.functions().add("fan", [this, &n1](tensor x) {
      tensor h = troupe::matmul(x, w);
      troupe::register_hook(h, [this](const tensor&) -> tensor {
        h_runs.fetch_add(1);
        return {};
      });
      tensor a = troupe::rpc_sync<tensor>(n1, "worker0", "square", h);
      tensor b = troupe::rpc_sync<tensor>(n1, "worker0", "square", h);
      return troupe::add(a, b);
    });
    n1.functions().add("relay", [&n1](tensor x) {
      tensor z = troupe::rpc_sync<tensor>(n1, "worker2", "fwd2", troupe::mul(x, x));
      return troupe::mul(z, z);
    });
    job.at(2).functions().add("fwd2", [this](tensor y) { return troupe::matmul(y, w2); });
  }
};

/// Local reference of "fan": the gradients of x and w in their .grad.
std::pair<tensor, tensor> fan_reference() {
  tensor xl = leaf(5, {2, 3}), wl = leaf(11, {3, 4});
  tensor h = troupe::matmul(xl, wl);
  troupe::backward(troupe::sum(troupe::add(troupe::mul(h, h), troupe::mul(h, h))));
  return {xl, wl};
}

/// Short control-message timeouts and many attempts, for the fault-plan tests.
da::container_options fault_options() {
  da::container_options o;
  o.propagate_timeout = 300ms;
  o.release_timeout = 300ms;
  o.attempts = 8;
  o.backoff = 5ms;
  return o;
}

/// Puts the fault plan `text` on every node of `t`; returns its injector (for the counters).
/// `log` (may be null) gets the injector's lines.
std::shared_ptr<troupe::fault_injector> inject(three_workers& t, const std::string& text,
                                               troupe::fault_injector::log_sink log = nullptr) {
  auto injector = std::make_shared<troupe::fault_injector>(troupe::fault_plan::parse(text), std::move(log));
  t.job.c.hook->use(injector);
  return injector;
}

/// Rules that give the control messages of distributed autograd the fault `field=value`, with
/// its meaning for an RPC. The messages are the requests and replies of the propagation and the
/// release (Note [dist autograd service]). fail_first and drop lose requests, drop_reply loses
/// replies, the others apply to both.
std::string control_rules(const std::string& fault) {
  const std::string prefix = "rule actor:troupe.dist_autograd.";
  const bool requests_only = fault.rfind("fail_first=", 0) == 0 || fault.rfind("drop=", 0) == 0;
  const bool replies_only = fault.rfind("drop_reply=", 0) == 0;
  const std::string reply_fault = replies_only ? "drop=" + fault.substr(fault.find('=') + 1) : fault;
  std::string out;
  for (const char* kind : {"propagate", "release"}) {
    if (!replies_only) out += prefix + kind + "_request " + fault + "\n";
    if (!requests_only) out += prefix + kind + "_reply " + reply_fault + "\n";
  }
  return out;
}

/// One distributed "fan" iteration; checks the gradients on worker0 and worker1 bitwise.
void check_fan(three_workers& t, const tensor& x, const tensor& xl, const tensor& wl) {
  da::context ctx(t.job[0]);
  tensor out = troupe::rpc_sync<tensor>(t.job.at(0), "worker1", "fan", x);
  t.job[0].backward(ctx.id(), {troupe::sum(out)});
  CHECK(troupe::equal(t.job[0].get_gradients(ctx.id()).at(x), troupe::grad(xl)));
  CHECK(troupe::equal(t.job[1].get_gradients(ctx.id()).at(t.w), troupe::grad(wl)));
}

}  // namespace

TEST_CASE("a chain worker0 -> worker1 -> worker2 -> worker1 -> worker0 gives the local gradients bitwise",
          "[dist_autograd]") {
  three_workers t;
  tensor xl = leaf(5, {2, 3}), w2l = leaf(12, {3, 4});
  tensor zl = troupe::matmul(troupe::mul(xl, xl), w2l);
  troupe::backward(troupe::sum(troupe::mul(zl, zl)));
  tensor x = leaf(5, {2, 3});
  for (int iter = 0; iter < 20; ++iter) {
    REQUIRE(t.job[0].await_releases(10s));  // ~context does not wait for the previous release
    da::context ctx(t.job[0]);
    tensor out = troupe::rpc_sync<tensor>(t.job.at(0), "worker1", "relay", x);
    t.job[0].backward(ctx.id(), {troupe::sum(out)});
    CHECK(troupe::equal(t.job[0].get_gradients(ctx.id()).at(x), troupe::grad(xl)));
    CHECK(troupe::equal(t.job[2].get_gradients(ctx.id()).at(t.w2), troupe::grad(w2l)));
    CHECK(t.job[2].num_contexts() == 1);  // worker2 learnt the context from worker1's nested call
  }
  CHECK(t.job.contexts() == 0);
}

TEST_CASE("a node shared by two send functions runs once per pass, after both propagations arrived",
          "[dist_autograd]") {
  three_workers t;
  const auto [xl, wl] = fan_reference();
  tensor x = leaf(5, {2, 3});
  for (int iter = 0; iter < 10; ++iter) {
    t.h_runs = 0;
    check_fan(t, x, xl, wl);
    CHECK(t.h_runs.load() == 1);
  }
  CHECK(t.job.contexts() == 0);
}

TEST_CASE("propagate and release survive dropped, duplicated and lost-reply control messages", "[dist_autograd][fault]") {
  three_workers t(fault_options());
  auto lost_replies = std::make_shared<std::atomic<int>>(0);
  auto injector = inject(t,
                         "seed 7\n"
                         "rule actor:troupe.dist_autograd.propagate_request fail_first=2 duplicate=0.2\n"
                         "rule actor:troupe.dist_autograd.propagate_reply drop=0.1 duplicate=0.2\n"
                         "rule actor:troupe.dist_autograd.release_request fail_first=2 drop=0.1 duplicate=0.2\n"
                         "rule actor:troupe.dist_autograd.release_reply drop=0.1 duplicate=0.2\n",
                         [lost_replies](const std::string& line) {
                           if (line.rfind("troupe-fault: drop ", 0) == 0 && line.find("_reply #") != std::string::npos)
                             ++*lost_replies;
                         });
  const auto [xl, wl] = fan_reference();
  tensor x = leaf(5, {2, 3});
  for (int iter = 0; iter < 20; ++iter) check_fan(t, x, xl, wl);
  t.job.c.hook->use(nullptr);
  CHECK(t.job.contexts() == 0);
  const auto n = injector->counters();
  CHECK(n.dropped_requests >= 4 + static_cast<std::uint64_t>(lost_replies->load()));  // actor messages count as requests
  CHECK(lost_replies->load() >= 1);
  CHECK(n.duplicated >= 1);
}

TEST_CASE("propagate and release keep the gradients bitwise under each fault type of the fault plan",
          "[dist_autograd][fault]") {
  const std::string fault = GENERATE(as<std::string>{}, "fail_first=3", "drop=0.15", "drop_reply=0.15", "duplicate=0.3",
                                     "delay=1..4", "reorder=8");
  three_workers t(fault_options());
  auto injector = inject(t, "seed 11\n" + control_rules(fault));
  const auto [xl, wl] = fan_reference();
  tensor x = leaf(5, {2, 3});
  for (int iter = 0; iter < 10; ++iter) {
    t.h_runs = 0;
    check_fan(t, x, xl, wl);
    CHECK(t.h_runs.load() == 1);  // a retried or duplicated propagation never runs a node twice
    CHECK(t.job.contexts() == 0);
  }
  t.job.c.hook->use(nullptr);
  const auto n = injector->counters();
  INFO(fault);
  CHECK(n.dropped_requests + n.dropped_replies + n.duplicated + n.delayed > 0);
}

TEST_CASE("an exception in the backward of a worker two hops away fails the caller's backward with its text",
          "[dist_autograd]") {
  three_workers t;
  t.job.at(2).functions().add("fwd2_bad", [&t](tensor y) {
    tensor z = troupe::matmul(y, t.w2);
    troupe::register_hook(z, [](const tensor&) -> tensor { throw std::runtime_error("boom in worker2"); });
    return z;
  });
  auto& n1 = t.job.at(1);
  n1.functions().add("relay_bad", [&n1](tensor x) {
    return troupe::mul(troupe::rpc_sync<tensor>(n1, "worker2", "fwd2_bad", troupe::mul(x, x)), 2.0);
  });
  tensor x = leaf(5, {2, 3});
  {
    da::context ctx(t.job[0]);
    tensor out = troupe::rpc_sync<tensor>(t.job.at(0), "worker1", "relay_bad", x);
    try {
      t.job[0].backward(ctx.id(), {troupe::sum(out)});
      FAIL("the exception on worker2 did not reach the caller");
    } catch (const troupe::error& e) {
      CHECK(e.code() == troupe::errc::remote_exception);
      CHECK_THAT(e.what(), Catch::Contains("boom in worker2"));
      CHECK_THAT(e.what(), Catch::Contains("worker2"));
    }
    CHECK(t.job[1].num_contexts() == 0);  // released on every other worker by the failed backward
    CHECK(t.job[2].num_contexts() == 0);
  }
  CHECK(t.job.contexts() == 0);
}

TEST_CASE("a context ends without waiting for its release, and a release whose first attempt is lost is retried",
          "[dist_autograd][fault]") {
  da::container_options o;
  o.release_timeout = 1500ms;  // ~context would block this long if it waited for the lost attempt
  o.attempts = 3;
  o.backoff = 5ms;
  three_workers t(o);
  tensor x = leaf(5, {2, 3});
  auto ended = std::chrono::steady_clock::duration::zero();
  {
    auto ctx = std::make_unique<da::context>(t.job[0]);
    tensor out = troupe::rpc_sync<tensor>(t.job.at(0), "worker1", "relay", x);
    t.job[0].backward(ctx->id(), {troupe::sum(out)});
    REQUIRE(t.job[1].num_contexts() == 1);
    auto injector = inject(t, "seed 3\nrule actor:troupe.dist_autograd.release_request fail_first=1\n");
    const auto t0 = std::chrono::steady_clock::now();
    ctx.reset();
    ended = std::chrono::steady_clock::now() - t0;
    CHECK(t.job[0].num_contexts() == 0);  // gone here at once
    REQUIRE(t.job[0].await_releases(20s));  // the retry after release_timeout released worker1
    t.job.c.hook->use(nullptr);
    CHECK(injector->counters().dropped_requests == 1);
  }
  CHECK(ended < 750ms);
  CHECK(t.job[1].num_contexts() == 0);
  CHECK(t.job[2].num_contexts() == 0);  // worker1 forwarded it to worker2
}
