// Tests of ddp::live_group (Note [live recovery]) inside one process: its checks, generations and
// the roll-back to the last commit. A replacement joining a live job is tested end to end by the
// ctest of examples/live_recovery.
#include <catch2/catch.hpp>

#include <cstring>

#include "integration/node_harness.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/ddp/live_group.hpp"
#include "troupe/tensors/factories.hpp"

using namespace troupe;

TEST_CASE("a live group refuses a rank outside the world and an empty name", "[ddp][live]") {
  troupe::node n(troupe::test::test_options(0, 1, 0));
  CHECK_THROWS_MATCHES(ddp::live_group(n.store(), 1, 1, "j", false), error,
                       Catch::Matchers::Predicate<error>([](const error& e) { return e.code() == errc::bad_argument; }));
  CHECK_THROWS_MATCHES(ddp::live_group(n.store(), 0, 1, "", false), error,
                       Catch::Matchers::Predicate<error>([](const error& e) { return e.code() == errc::bad_argument; }));
  ddp::live_group live(n.store(), 0, 1, "j", false);
  CHECK_THROWS_MATCHES(live.group(), error,
                       Catch::Matchers::Predicate<error>([](const error& e) { return e.code() == errc::invalid_state; }));
  n.shutdown(shutdown_mode::graceful);
}

TEST_CASE("a live group's recovery forms the next generation and rolls counters and generators back to the last commit",
          "[ddp][live]") {
  troupe::node n(troupe::test::test_options(0, 1, 0));
  generator init(5);
  nn::linear net(3, 2, init);
  optim::sgd opt(net.parameters(), {.lr = 0.1, .momentum = 0.9});
  generator gen(9);
  std::int64_t position = 0;
  ddp::live_group live(n.store(), 0, 1, "roll", false);
  live.track("net", net);
  live.track("opt", opt);
  live.track("gen", gen);
  live.track("position", position);
  REQUIRE(live.start() == 0);
  CHECK(live.generation() == 0);
  CHECK(live.group().name() == "roll-g0");

  position = 7;
  gen.reserve(3);
  live.commit(4);
  position = 11;  // a step in progress that fails
  gen.reserve(5);
  const auto offset_at_commit = gen.offset() - 5;

  CHECK(live.recover() == 4);
  CHECK(live.generation() == 1);
  CHECK(live.group().name() == "roll-g1");
  CHECK(position == 7);
  CHECK(gen.seed() == 9);
  CHECK(gen.offset() == offset_at_commit);
  CHECK(live.last_source() == 0);
  CHECK(live.last_state_bytes() > 0);
  n.shutdown(shutdown_mode::graceful);
}
