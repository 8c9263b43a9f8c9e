// Distributed autograd between namespace hosts (FAST mode): a forward that crosses to the other
// host and back gives the local gradients bitwise, on both hosts, and every context is released.
#include <thread>

#include <catch2/catch.hpp>

#include "multihost/rank_env.hpp"
#include "multihost/two_host_job.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/dist_autograd/container.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace std::chrono_literals;
using troupe::tensor;
using troupe::test::worker;
namespace da = troupe::dist_autograd;

TEST_CASE("distributed autograd crosses hosts and gives the local gradients bitwise", "[multihost][dist_autograd]") {
  troupe::test::netns_bed bed(2);
  troupe::test::require_bed(bed);
  const auto r = troupe::test::run_two_host_job(bed, troupe::test::rank_program("[.mh_dist_autograd_rank]"));
  INFO(r.all());
  CHECK(r.codes == std::vector<int>{0, 0});
  for (const auto& out : r.outputs) CHECK_THAT(out, Catch::Contains("All tests passed") && !Catch::Contains("failed"));
}

namespace {

tensor leaf(tensor t) {
  troupe::set_requires_grad(t);
  return t;
}
tensor make_w() {
  troupe::generator g(11);
  return troupe::randn({3, 4}, g);
}
tensor make_x() {
  troupe::generator g(5);
  return troupe::randn({2, 3}, g);
}

// y = x @ w; z = square(y) (on host 0); loss = sum(z * y). Returns the leaves x, w with .grad.
std::pair<tensor, tensor> local_reference() {
  tensor x = leaf(make_x()), w = leaf(make_w());
  tensor y = troupe::matmul(x, w);
  troupe::backward(troupe::sum(troupe::mul(troupe::mul(y, y), y)));
  return {x, w};
}

}  // namespace

// One rank (hidden). worker0 (host 0) holds x and runs the backward. worker2 (host 1) holds w and
// sends y back to worker1 (host 0) to be squared. The path: host 0 -> host 1 -> host 0 -> host 1
// -> host 0.
TEST_CASE("multihost dist autograd rank: a forward over both hosts, backward on worker0", "[.mh_dist_autograd_rank]") {
  auto o = troupe::test::rank_options();
  da::add_message_types(o);
  troupe::node n(o);
  const int me = n.info().rank;
  {
    da::container dist(n);
    tensor w = leaf(make_w());
    const auto [xl, wl] = local_reference();
    n.functions().add("square", [](tensor y) { return troupe::mul(y, y); });
    n.functions().add("fwd_nested", [&n, w](tensor x) {
      tensor y = troupe::matmul(x, w);
      return troupe::mul(troupe::rpc_sync<tensor>(n, worker(1), "square", y), y);
    });
    n.functions().add("w_grad_is_local", [&dist, w, wl = wl](std::uint64_t ctx) {
      return troupe::equal(dist.get_gradients(ctx).at(w), troupe::grad(wl));
    });
    n.store().barrier("registered", me, 4, 30s);
    if (me == 0) {
      tensor x = leaf(make_x());
      for (int iter = 0; iter < 3; ++iter) {
        da::context ctx(dist);
        tensor loss = troupe::sum(troupe::rpc_sync<tensor>(n, worker(2), "fwd_nested", x));
        dist.backward(ctx.id(), {loss});
        CHECK(troupe::equal(dist.get_gradients(ctx.id()).at(x), troupe::grad(xl)));
        CHECK(troupe::rpc_sync<bool>(n, worker(2), "w_grad_is_local", ctx.id()));
      }
    }
    n.store().barrier("backward", me, 4, 60s);
    // Contexts are released on every worker that took part (bounded wait: the release is a message).
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (dist.num_contexts() != 0 && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(10ms);
    CHECK(dist.num_contexts() == 0);
    n.store().barrier("released", me, 4, 30s);
  }
  troupe::test::finish_rank(n);
}
