// Multi-process tests of Note [predicted quick] (actors/src/executor.hpp). A function whose
// recent runs were all short is run by the executor's leader without waking a follower. Such a
// prediction may fail: the function blocks this time, or makes a nested call. Then the calls
// behind it are still served promptly.
#include <chrono>
#include <thread>

#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;

namespace {

// Enough short runs for any function to be predicted short (the rule wants the last 16).
constexpr int warm_runs = 64;

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("a function predicted short that blocks this time does not hold up the calls behind it", "[actors][rpc]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) {
    troupe::node n(troupe::test::test_options(1, 2, pipe.read()));
    n.functions().add("maybe_sleep", [](int ms) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));  // its own wait: nothing the runtime sees
      return ms;
    });
    troupe::test::serve_until_done(n);
  });
  troupe::node n(troupe::test::test_options(0, 2, 0));
  pipe.publish(n.port(), 1);
  n.store().wait({"ready"}, 10s);
  for (int i = 0; i < warm_runs; ++i) REQUIRE(troupe::rpc_sync<int>(n, "worker1", "maybe_sleep", 0) == 0);
  for (int round = 0; round < 3; ++round) {
    auto slow = troupe::rpc_async<int>(n, "worker1", "maybe_sleep", 800, 10s);
    std::this_thread::sleep_for(30ms);  // the slow call is running on the callee's leader by now
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(troupe::rpc_sync<int>(n, "worker1", "maybe_sleep", 0) == 0);
    const double waited = ms_since(t0);
    INFO("round " << round << ": a small call behind an 800 ms one took " << waited << " ms");
    CHECK(waited < 400);  // the watchdog hands the lead on within two 1 ms ticks; 800 ms if nobody did
    CHECK(slow.get() == 800);
    for (int i = 0; i < warm_runs; ++i) REQUIRE(troupe::rpc_sync<int>(n, "worker1", "maybe_sleep", 0) == 0);  // predicted again
  }
  troupe::test::release_children(n);
  CHECK(children.join(20s));
}

TEST_CASE("a function predicted short that makes a nested call back through its caller completes promptly", "[actors][rpc]") {
  // worker0 calls relay on worker1. relay, predicted short from its earlier runs, calls bounce on
  // worker0, which calls inner on worker1 again. worker1's leader is inside relay, so a
  // follower of worker1 must take the lead to read inner (long_work_ahead() before relay blocks
  // on its call).
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) {
    troupe::node n(troupe::test::test_options(1, 2, pipe.read()));
    n.functions().add("inner", [](int x) { return x + 1; });
    n.functions().add("relay", [&n](int x) { return x == 0 ? 0 : troupe::rpc_sync<int>(n, "worker0", "bounce", x); });
    troupe::test::serve_until_done(n);
  });
  troupe::node n(troupe::test::test_options(0, 2, 0));
  n.functions().add("bounce", [&n](int x) { return 2 * troupe::rpc_sync<int>(n, "worker1", "inner", x); });
  pipe.publish(n.port(), 1);
  n.store().wait({"ready"}, 10s);
  for (int i = 0; i < warm_runs; ++i) REQUIRE(troupe::rpc_sync<int>(n, "worker1", "relay", 0) == 0);
  for (int x = 1; x <= 20; ++x) {
    const auto t0 = std::chrono::steady_clock::now();
    CHECK(troupe::rpc_sync<int>(n, "worker1", "relay", x, 5s) == 2 * (x + 1));
    CHECK(ms_since(t0) < 1000);
  }
  troupe::test::release_children(n);
  CHECK(children.join(20s));
}

