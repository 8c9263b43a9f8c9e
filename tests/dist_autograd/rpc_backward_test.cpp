// Distributed backward through plain RPCs recorded automatically (Note [dist autograd
// recording]). Forwards split over in-process workers equal the local computation bitwise.
// Also: nested calls, errors, retain_graph, concurrent contexts, release on every worker.
#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <thread>

#include <catch2/catch.hpp>

#include "dist_autograd/dist_job.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/autograd/variable.hpp"
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

tensor make_w(std::uint64_t seed = 11) {
  troupe::generator gen(seed);
  return troupe::randn({3, 4}, gen);
}
tensor make_x() {
  troupe::generator gen(5);
  return troupe::randn({2, 3}, gen);
}
tensor leaf(tensor t) {
  troupe::set_requires_grad(t);
  return t;
}

/// worker1 holds w. "fwd" computes x @ w; with `fail`, its backward throws. "fwd_nested"
/// computes y = x @ w, sends y back to worker0's "square" and returns square(y) * y.
struct two_workers {
  troupe::test::dist_job job{2};
  tensor w = leaf(make_w());

  two_workers() {
    auto& n1 = job.at(1);
    n1.functions().add("fwd", [this](tensor x, bool fail) {
      tensor y = troupe::matmul(x, w);
      if (fail) troupe::register_hook(y, [](const tensor&) -> tensor { throw std::runtime_error("boom in worker1"); });
      return y;
    });
    n1.functions().add("refuse", [](tensor x) -> tensor { throw std::runtime_error("refused " + troupe::shape_to_string(x.shape())); });
    n1.functions().add("fwd_nested", [this, &n1](tensor x) {
      tensor y = troupe::matmul(x, w);
      tensor z = troupe::rpc_sync<tensor>(n1, "worker0", "square", y);
      return troupe::mul(z, y);
    });
    job.at(0).functions().add("square", [](tensor y) { return troupe::mul(y, y); });
  }
  tensor wgrad(da::context_id ctx) { return job[1].get_gradients(ctx).at(w); }
};

/// worker0's part: x -> worker1 -> y; returns sum(y * y).
tensor distributed_loss(troupe::node& n, const tensor& x, bool fail) {
  tensor y = troupe::rpc_sync<tensor>(n, "worker1", "fwd", x, fail);
  return troupe::sum(troupe::mul(y, y));
}

/// The same computation done locally: leaves x and w whose .grad holds the reference gradients.
std::pair<tensor, tensor> local_reference() {
  tensor xl = leaf(make_x()), wl = leaf(make_w());
  tensor yl = troupe::matmul(xl, wl);
  troupe::backward(troupe::sum(troupe::mul(yl, yl)));
  return {xl, wl};
}

}  // namespace

TEST_CASE("gradients of a forward split over two workers by rpc equal the local ones bitwise and contexts are released",
          "[dist_autograd]") {
  two_workers t;
  const auto [xl, wl] = local_reference();
  tensor x = leaf(make_x());
  for (int iter = 0; iter < 20; ++iter) {
    REQUIRE(t.job[0].await_releases(10s));  // ~context does not wait for the previous release
    da::context ctx(t.job[0]);
    CHECK(t.job[0].current_context() == ctx.id());
    t.job[0].backward(ctx.id(), {distributed_loss(t.job.at(0), x, false)});
    CHECK(troupe::equal(t.job[0].get_gradients(ctx.id()).at(x), troupe::grad(xl)));
    CHECK(troupe::equal(t.wgrad(ctx.id()), troupe::grad(wl)));
    CHECK_FALSE(troupe::grad(x).defined());
    CHECK_FALSE(troupe::grad(t.w).defined());
    CHECK(t.job[1].num_contexts() == 1);
  }
  CHECK(t.job[0].current_context() == 0);
  CHECK(t.job.contexts() == 0);
}

TEST_CASE("a tensor that travels worker0 -> worker1 -> worker0 in a nested call gives the local gradients bitwise",
          "[dist_autograd]") {
  two_workers t;
  tensor xl = leaf(make_x()), wl = leaf(make_w());
  tensor yl = troupe::matmul(xl, wl);
  troupe::backward(troupe::sum(troupe::mul(troupe::mul(yl, yl), yl)));
  tensor x = leaf(make_x());
  for (int iter = 0; iter < 10; ++iter) {
    da::context ctx(t.job[0]);
    tensor out = troupe::rpc_sync<tensor>(t.job.at(0), "worker1", "fwd_nested", x);
    t.job[0].backward(ctx.id(), {troupe::sum(out)});
    CHECK(troupe::equal(t.job[0].get_gradients(ctx.id()).at(x), troupe::grad(xl)));
    CHECK(troupe::equal(t.wgrad(ctx.id()), troupe::grad(wl)));
  }
  CHECK(t.job.contexts() == 0);
}

TEST_CASE("an exception in a remote backward fails the caller's backward with the remote text and releases the context",
          "[dist_autograd]") {
  two_workers t;
  tensor x = leaf(make_x());
  {
    da::context ctx(t.job[0]);
    tensor loss = distributed_loss(t.job.at(0), x, true);
    REQUIRE(t.job[1].num_contexts() == 1);
    try {
      t.job[0].backward(ctx.id(), {loss});
      FAIL("the remote exception did not reach the caller");
    } catch (const troupe::error& e) {
      CHECK(e.code() == errc::remote_exception);
      CHECK_THAT(e.what(), Catch::Contains("boom in worker1"));
    }
    CHECK_FALSE(t.job[0].get_gradients(ctx.id()).contains(x));
    CHECK(t.job[1].num_contexts() == 0);  // a failed backward released it on the other worker
  }
  CHECK(t.job.contexts() == 0);
  try {
    da::context ctx(t.job[0]);
    tensor plain = troupe::ones({1});
    t.job[0].backward(ctx.id(), {plain});
    FAIL("a root without grad was accepted");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::autograd_error);
  }
}

TEST_CASE("a call that failed in the forward does not hold back the backward of the calls that succeeded",
          "[dist_autograd]") {
  two_workers t;
  const auto [xl, wl] = local_reference();
  tensor x = leaf(make_x());
  da::context ctx(t.job[0]);
  CHECK_THROWS_AS(troupe::rpc_sync<tensor>(t.job.at(0), "worker1", "refuse", x), troupe::error);
  t.job[0].backward(ctx.id(), {distributed_loss(t.job.at(0), x, false)});
  CHECK(troupe::equal(t.job[0].get_gradients(ctx.id()).at(x), troupe::grad(xl)));
  CHECK(troupe::equal(t.wgrad(ctx.id()), troupe::grad(wl)));
}

TEST_CASE("retain_graph allows a second distributed backward that accumulates in the context", "[dist_autograd]") {
  two_workers t;
  const auto [xl, wl] = local_reference();
  tensor x = leaf(make_x());
  da::context ctx(t.job[0]);
  tensor loss = distributed_loss(t.job.at(0), x, false);
  t.job[0].backward(ctx.id(), {loss}, /*retain_graph=*/true);
  t.job[0].backward(ctx.id(), {loss}, /*retain_graph=*/true);
  t.job[0].backward(ctx.id(), {loss});
  CHECK(troupe::equal(t.job[0].get_gradients(ctx.id()).at(x), troupe::mul(troupe::grad(xl), 3.0)));
  CHECK(troupe::equal(t.wgrad(ctx.id()), troupe::mul(troupe::grad(wl), 3.0)));
  CHECK_THROWS_AS(t.job[0].backward(ctx.id(), {loss}), troupe::error);  // the graph was freed
}

TEST_CASE("two threads running distributed backward in their own contexts do not mix gradients", "[dist_autograd]") {
  two_workers t;
  // Named references, not a structured binding: clang 14 cannot capture one in a lambda.
  const auto reference = local_reference();
  const auto& xl = reference.first;
  const auto& wl = reference.second;
  tensor x = leaf(make_x());
  std::atomic<int> good{0};
  auto one = [&] {
    for (int i = 0; i < 50; ++i) {
      da::context ctx(t.job[0]);
      t.job[0].backward(ctx.id(), {distributed_loss(t.job.at(0), x, false)});
      if (troupe::equal(t.job[0].get_gradients(ctx.id()).at(x), troupe::grad(xl)) &&
          troupe::equal(t.wgrad(ctx.id()), troupe::grad(wl)))
        good.fetch_add(1);
    }
  };
  std::thread t1(one), t2(one);
  t1.join();
  t2.join();
  CHECK(good.load() == 100);
  CHECK(t.job.contexts() == 0);
}

TEST_CASE("an rpc outside any context records nothing and creates no context", "[dist_autograd]") {
  two_workers t;
  tensor x = leaf(make_x());
  tensor y = troupe::rpc_sync<tensor>(t.job.at(0), "worker1", "fwd", x, false);
  CHECK_FALSE(y.requires_grad());
  CHECK(t.job.contexts() == 0);
}

TEST_CASE("the node's flight recorder holds each distributed backward and the rpcs it made and served",
          "[dist_autograd][recorder]") {
  two_workers t;
  tensor x = leaf(make_x());
  da::context ctx(t.job[0]);
  t.job[0].backward(ctx.id(), {distributed_loss(t.job.at(0), x, false)});
  const auto mine = t.job.at(0).recorder().last();
  const auto backward_of = [&](const troupe::trace_entry& e) {
    return e.kind == troupe::trace_kind::backward && e.name == "dist_backward" && e.seq == ctx.id() && e.ended && e.ok;
  };
  CHECK(std::any_of(mine.begin(), mine.end(), backward_of));
  CHECK(std::any_of(mine.begin(), mine.end(), [](const troupe::trace_entry& e) {
    return e.kind == troupe::trace_kind::rpc_call && e.name == "fwd" && e.detail == "worker1" && e.ended && e.ok;
  }));
  const auto served = t.job.at(1).recorder().last();
  CHECK(std::any_of(served.begin(), served.end(), [](const troupe::trace_entry& e) {
    return e.kind == troupe::trace_kind::rpc_serve && e.name == "fwd" && e.detail == "worker0" && e.ended;
  }));
}
