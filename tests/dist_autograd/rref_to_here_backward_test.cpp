// Gradients through RRefs (issue 6). remote() + to_here(), a user -> user forked rref, and a
// method called with remote() semantics record send/recv functions like any RPC. So a
// distributed backward gives the local gradients bitwise (Note [owner_rref actor]: the owner
// keeps the live value and encodes it under the fetch's scope). Also: owner-local to_here /
// local_value return the live tensor itself.
#include <functional>

#include <catch2/catch.hpp>

#include "dist_autograd/dist_job.hpp"
#include "troupe/actors/rref/rref.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace std::chrono_literals;
using troupe::rref;
using troupe::tensor;
namespace da = troupe::dist_autograd;

namespace {

tensor leaf(tensor t) {
  troupe::set_requires_grad(t);
  return t;
}
tensor make_w() {
  troupe::generator gen(11);
  return leaf(troupe::randn({3, 4}, gen));
}
tensor make_x() {
  troupe::generator gen(5);
  return leaf(troupe::randn({2, 3}, gen));
}

/// The local reference of y = x @ w, z = y * k, loss = sum(z * z): leaves whose .grad is it.
std::pair<tensor, tensor> local_reference(double k) {
  tensor xl = make_x(), wl = make_w();
  tensor z = troupe::mul(troupe::matmul(xl, wl), k);
  troupe::backward(troupe::sum(troupe::mul(z, z)));
  return {xl, wl};
}

/// worker1 holds the leaf w. "fwd"(x) = x @ w, for remote(). "weight" returns an rref to w.
/// Method "mm" of rref<tensor> computes x @ w. worker2's "use"(r) = r.to_here() * 2.
struct rref_job {
  troupe::test::dist_job job;
  tensor w = make_w();

  explicit rref_job(int n) : job(n) {
    auto& c1 = job.c[1];
    troupe::add_function(c1, "fwd", [this](tensor x) { return troupe::matmul(x, w); });
    troupe::add_function(c1, "weight", [this, &c1] { return troupe::make_rref(c1, w); });
    troupe::add_method<tensor>(c1, "mm", [](tensor& held, tensor x) { return troupe::matmul(x, held); });
    if (n > 2) troupe::add_function(job.c[2], "use", [](rref<tensor> r) { return troupe::mul(r.to_here(5s), 2.0); });
  }
  /// Backward of sum(z * z) on worker0; checks the gradients of x (worker0) and w (worker1).
  void check_backward(const da::context& ctx, const tensor& x, const tensor& z, double k) {
    const auto [xl, wl] = local_reference(k);
    job[0].backward(ctx.id(), {troupe::sum(troupe::mul(z, z))});
    const auto gx = job[0].get_gradients(ctx.id());
    const auto gw = job[1].get_gradients(ctx.id());
    REQUIRE(gx.contains(x));
    REQUIRE(gw.contains(w));
    CHECK(troupe::equal(gx.at(x), troupe::grad(xl)));
    CHECK(troupe::equal(gw.at(w), troupe::grad(wl)));
    CHECK_FALSE(troupe::grad(x).defined());  // accumulated in the context, not in .grad
  }
  /// `iters` forwards z = forward(x) on worker0, each in a fresh context, each checked by
  /// check_backward against the local z = (x @ w) * k.
  void iterate(int iters, double k, const std::function<tensor(const tensor&)>& forward) {
    tensor x = make_x();
    for (int i = 0; i < iters; ++i) {
      da::context ctx(job[0]);
      check_backward(ctx, x, forward(x), k);
    }
  }
};

}  // namespace

TEST_CASE("gradients through remote() and to_here() reach both workers and equal the local ones bitwise",
          "[dist_autograd][rref]") {
  rref_job t(2);
  t.iterate(5, 1.0, [&](const tensor& x) {
    tensor y = troupe::remote<tensor>(t.job.c[0], "worker1", "fwd", x).to_here(5s);
    CHECK(y.requires_grad());  // the recv function of the fetch's response
    return troupe::mul(y, 1.0);
  });
  CHECK(t.job.c.quiescent(10s));
  CHECK(t.job.contexts() == 0);
}

TEST_CASE("a user -> user forked rref whose to_here runs on the receiver carries gradients back through both hops",
          "[dist_autograd][rref]") {
  rref_job t(3);
  t.iterate(3, 2.0, [&](const tensor& x) {
    auto r = troupe::remote<tensor>(t.job.c[0], "worker1", "fwd", x);
    // worker2 receives a fork of r (worker0 -> worker2), fetches it from worker1 and returns y * 2.
    return troupe::rpc_sync<tensor>(t.job.c[0], "worker2", "use", r);
  });
  CHECK(t.job.c.quiescent(10s));
  CHECK(t.job.contexts() == 0);
}

TEST_CASE("a method called with remote() semantics on an rref<tensor> carries gradients to the owner's live tensor",
          "[dist_autograd][rref]") {
  rref_job t(2);
  auto wref = troupe::rpc_sync<rref<tensor>>(t.job.c[0], "worker1", "weight");
  t.iterate(3, 1.0, [&](const tensor& x) { return troupe::mul(wref.remote<tensor>("mm", x).to_here(5s), 1.0); });
  wref = rref<tensor>();
  CHECK(t.job.c.quiescent(10s));
}

TEST_CASE("owner-local to_here and local_value return the live tensor itself, no copy", "[dist_autograd][rref]") {
  rref_job t(2);
  auto& c1 = t.job.c[1];
  auto mine = troupe::make_rref(c1, t.w);
  CHECK(mine.local_value().is_same(t.w));
  CHECK(mine.to_here(5s).is_same(t.w));
  // An rref that came back to its owner is owner-local there: the same live tensor.
  troupe::add_function(c1, "is_w", [&t](rref<tensor> r) { return r.local_value().is_same(t.w) && r.to_here(5s).is_same(t.w); });
  auto wref = troupe::rpc_sync<rref<tensor>>(t.job.c[0], "worker1", "weight");
  CHECK(troupe::rpc_sync<bool>(t.job.c[0], "worker1", "is_w", wref));
  // Off the owner, to_here is a copy with the same values.
  CHECK(troupe::equal(wref.to_here(5s), t.w.detach()));
  CHECK_FALSE(wref.to_here(5s).is_same(t.w));
}
