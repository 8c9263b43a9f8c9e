// The distributed optimizer through a parameter-server rref (Note [distributed optimizer]), two
// processes: this one is the trainer (worker0), a forked child owns the parameter (worker1).
#include <boost/serialization/string.hpp>
#include <catch2/catch.hpp>

#include "dist_options.hpp"
#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/dist_autograd/optimizer.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace std::chrono_literals;
using troupe::tensor;
namespace da = troupe::dist_autograd;

namespace {

tensor randn(std::uint64_t seed, troupe::shape_t shape) {
  troupe::generator gen(seed);
  return troupe::randn(shape, gen);
}

/// The object behind the server's rref (its parameter lives in the container).
struct server {
  std::string name;
  template <class Ar> void serialize(Ar& ar, unsigned) { ar & name; }
};

// worker1: parameter w (3x4) behind rref<server>::forward(x) = x @ w; "live" returns w's value.
void parameter_server(troupe::test::port_pipe& pipe) {
  troupe::node n(troupe::test::dist_options(1, 2, pipe.read()));
  {
    troupe::rref_context rc(n);
    da::container dist(n);
    auto w = da::make_parameter(rc, dist, randn(11, {3, 4}));
    auto plain = troupe::make_rref(rc, randn(1, {2}));  // an rref<tensor> that is no parameter
    auto ps = troupe::make_rref(rc, server{"ps"});
    troupe::add_method<server>(rc, "forward", [&](server&, tensor x) { return troupe::matmul(x, da::local_parameter(dist, w)); });
    troupe::add_function(rc, "server", [&ps] { return ps.share(); });
    troupe::add_function(rc, "weight", [&w] { return w.share(); });
    troupe::add_function(rc, "plain", [&plain] { return plain.share(); });
    n.functions().add("live", [&] { return da::local_parameter(dist, w).detach().clone(); });
    n.store().set("ready/1", "1");
    n.store().get("done", 60s);
  }
  n.shutdown(troupe::shutdown_mode::graceful, 10s);
}

}  // namespace

TEST_CASE("a distributed optimizer step through a parameter-server rref equals the local functional step bitwise",
          "[dist_autograd][rref]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&pipe](int) { parameter_server(pipe); });
  troupe::node n(troupe::test::dist_options(0, 2, 0));
  pipe.publish(n.port(), 1);
  n.store().wait({"ready/1"}, 10s);
  {
    troupe::rref_context rc(n);
    da::container dist(n);
    // The reference: the same forward/backward locally and one functional sgd step.
    tensor xl = randn(5, {2, 3}), wl = randn(11, {3, 4});
    troupe::set_requires_grad(xl);
    troupe::set_requires_grad(wl);
    tensor yl = troupe::matmul(xl, wl);
    troupe::backward(troupe::sum(troupe::mul(yl, yl)));
    tensor expected = randn(11, {3, 4});
    troupe::set_requires_grad(expected);
    troupe::optim::sgd local_opt({expected}, {0.1, 0, 0, 0, false});
    local_opt.step({expected}, {troupe::grad(wl)});

    auto ps = troupe::rpc_sync<troupe::rref<server>>(rc, "worker1", "server");
    std::vector<troupe::rref<tensor>> params;
    params.push_back(troupe::rpc_sync<troupe::rref<tensor>>(rc, "worker1", "weight"));
    {
      da::distributed_optimizer opt(dist, da::optimizer_spec::make_sgd({0.1, 0, 0, 0, false}), params);
      tensor x = randn(5, {2, 3});
      troupe::set_requires_grad(x);
      {
        da::context ctx(dist);
        tensor y = ps.rpc_sync<tensor>("forward", x);
        dist.backward(ctx.id(), {troupe::sum(troupe::mul(y, y))});
        CHECK(troupe::equal(dist.get_gradients(ctx.id()).at(x), troupe::grad(xl)));
        CHECK(opt.step(ctx.id()) == 1);
      }
      CHECK(troupe::equal(troupe::rpc_sync<tensor>(n, "worker1", "live"), expected.detach()));
      CHECK(troupe::equal(params[0].to_here(5s), expected.detach()));  // the rref's value follows the step
    }
    std::vector<troupe::rref<tensor>> unknown;
    unknown.push_back(troupe::rpc_sync<troupe::rref<tensor>>(rc, "worker1", "plain"));
    try {
      da::distributed_optimizer opt(dist, da::optimizer_spec::make_sgd({}), unknown);
      FAIL("an rref<tensor> that is no parameter was accepted");
    } catch (const troupe::error& e) {
      CHECK_THAT(e.what(), Catch::Contains("is not a parameter owned by worker1"));
    }
    CHECK(dist.num_contexts() == 0);
  }
  troupe::test::release_children(n);
  CHECK(children.join(10s));
}
