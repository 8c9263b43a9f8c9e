// A SIGKILLed owner: every to_here and method call of its RRefs fails with owner_lost naming it.
#include <signal.h>

#include <future>

#include <catch2/catch.hpp>

#include "integration/rref_owner_child.hpp"
#include "troupe/actors/rref/rref.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;
using troupe::errc;

using troupe::test::code_of;
using troupe::test::tally;

TEST_CASE("a SIGKILLed owner makes to_here and method calls fail with owner_lost naming it", "[rref][integration]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { troupe::test::rref_owner_child(pipe, 2); });
  troupe::node n(troupe::test::test_options(0, 2, 0));
  troupe::rref_context ctx(n);
  pipe.publish(n.port(), 1);
  n.store().wait({"ready/1"}, 10s);
  auto seven = troupe::remote<int>(ctx, "worker1", "seven");
  auto t = troupe::remote<tally>(ctx, "worker1", "tally");
  CHECK(seven.to_here(5s) == 7);
  CHECK(t.rpc_sync<std::int64_t>("inc", std::int64_t{2}) == 2);
  auto never = troupe::remote<std::size_t>(ctx, "worker1", "never");
  std::string message;
  auto parked = std::async(std::launch::async, [&] { return code_of([&] { never.to_here(10s); }, &message); });
  REQUIRE(parked.wait_for(300ms) == std::future_status::timeout);  // the fetch waits on the owner
  const auto t0 = std::chrono::steady_clock::now();
  children.kill(0, SIGKILL);
  REQUIRE(parked.wait_for(5s) == std::future_status::ready);
  CHECK(parked.get() == errc::owner_lost);
  const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  CHECK_THAT(message, Catch::Contains("worker1"));
  CHECK(code_of([&] { seven.to_here(3s); }, &message) == errc::owner_lost);
  CHECK_THAT(message, Catch::Contains("worker1"));
  CHECK(code_of([&] { t.rpc_sync<std::int64_t>("inc", std::int64_t{1}); }, &message) == errc::owner_lost);
  CHECK_THAT(message, Catch::Contains("worker1"));
  WARN("SIGKILL of the owner -> owner_lost: " << ms << " ms");
  CHECK(ms < 2000);
  // Releasing the rrefs of a dead owner ends (no retry forever) and leaves nothing behind.
  seven = {};
  t = {};
  never = {};
  CHECK(ctx.wait_quiescent(5s, true));
  CHECK_THROWS_AS(children.join(10s), troupe::error);  // rank 1 died by SIGKILL
}
