// Single-process tests of dist_autograd contexts: ids, counting, release, local-only backward.
#include <catch2/catch.hpp>

#include "dist_options.hpp"
#include "integration/node_harness.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/dist_autograd/container.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace std::chrono_literals;
using troupe::errc;
namespace da = troupe::dist_autograd;

TEST_CASE("context ids are unique, carry the worker rank, and contexts are released at scope end",
          "[dist_autograd]") {
  troupe::node n(troupe::test::dist_options(0, 1, 0));
  {  // the container goes before the node does
    da::container c(n);
    {
      da::context a(c);
      da::context b(c);
      CHECK(a.id() != b.id());
      CHECK((a.id() >> 48) == 0);
      CHECK(c.num_contexts() == 2);
      CHECK(c.current_context() == b.id());  // the innermost context is current
    }
    CHECK(c.num_contexts() == 0);
    CHECK(c.current_context() == 0);
    CHECK_THROWS_AS(c.get_gradients(12345), troupe::error);
  }
  n.shutdown(troupe::shutdown_mode::graceful, 10s);
}

TEST_CASE("a container on a node without the dist_autograd message types fails with invalid_state saying what to call",
          "[dist_autograd]") {
  troupe::node n(troupe::test::test_options(0, 1, 0));
  try {
    da::container c(n);
    FAIL("a container started without its message types");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::invalid_state);
    CHECK_THAT(e.what(), Catch::Contains("add_message_types"));
    CHECK_THAT(e.what(), Catch::Contains("worker0"));
  }
  n.shutdown(troupe::shutdown_mode::graceful, 10s);
}

TEST_CASE("a local-only backward in a context accumulates gradients in the context, not in .grad",
          "[dist_autograd]") {
  troupe::node n(troupe::test::dist_options(0, 1, 0));
  {  // the container goes before the node does
    da::container c(n);
    troupe::generator gen(7);
    troupe::tensor x = troupe::randn({3, 4}, gen);
    troupe::set_requires_grad(x);
    da::context ctx(c);
    troupe::tensor loss = troupe::sum(troupe::mul(x, x));
    c.backward(ctx.id(), {loss}, /*retain_graph=*/true);
    CHECK_FALSE(troupe::grad(x).defined());
    const auto g = c.get_gradients(ctx.id());
    REQUIRE(g.contains(x));
    CHECK(troupe::equal(g.at(x), troupe::mul(x.detach(), 2.0)));
    c.backward(ctx.id(), {loss});  // a second pass accumulates
    CHECK(troupe::equal(c.get_gradients(ctx.id()).at(x), troupe::mul(x.detach(), 4.0)));
    troupe::tensor plain = troupe::ones({2});
    try {
      c.backward(ctx.id(), {plain});
      FAIL("a root without grad was accepted");
    } catch (const troupe::error& e) {
      CHECK(e.code() == errc::autograd_error);
    }
  }
  n.shutdown(troupe::shutdown_mode::graceful, 10s);
}
