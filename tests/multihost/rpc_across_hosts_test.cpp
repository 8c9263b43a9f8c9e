// RPC between namespace hosts: 2 hosts x 2 ranks started by troupe-run, nodes bound to 0.0.0.0
// that publish their routable addresses (Note [listen and advertise]).
#include <catch2/catch.hpp>

#include <atomic>
#include <memory>

#include "multihost/rank_env.hpp"
#include "multihost/two_host_job.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"

using namespace std::chrono_literals;

TEST_CASE("rpc crosses hosts: every rank calls every other rank, large tensors come back intact and small calls pass a 64 MB one", "[multihost][rpc]") {
  troupe::test::netns_bed bed(2);
  troupe::test::require_bed(bed);
  const auto r = troupe::test::run_two_host_job(bed, troupe::test::rank_program("[.mh_rpc_rank]"), 60s, {"--listen-addr=0.0.0.0"});
  INFO(r.all());
  CHECK(r.codes == std::vector<int>{0, 0});
  for (const auto& out : r.outputs) CHECK_THAT(out, Catch::Contains("All tests passed") && !Catch::Contains("failed"));
}

// One rank of the job above (hidden: run by the launcher only).
TEST_CASE("multihost rpc rank: call every rank, echo 4 MB and 64 MB across hosts", "[.mh_rpc_rank]") {
  using troupe::test::worker;
  troupe::rpc::registry reg;
  reg.add("whoami", [](int from) { return troupe::test::this_host() + " answers " + std::to_string(from); });
  reg.add("echo", [](troupe::tensor t) { return t; });
  // Small calls served so far, and how many of them before a large echo started.
  auto pings = std::make_shared<std::atomic<int>>(0);
  auto pings_before_echo = std::make_shared<std::atomic<int>>(-1);
  reg.add("ping", [pings](int x) {
    ++*pings;
    return x + 1;
  });
  reg.add("echo_after_pings", [pings, pings_before_echo](troupe::tensor t) {
    pings_before_echo->store(pings->load());
    return t;
  });
  reg.add("pings_before_echo", [pings_before_echo](int) { return pings_before_echo->load(); });
  troupe::node n(troupe::test::rank_options(), reg);
  const int me = n.info().rank;
  REQUIRE(n.info().world_size == 4);
  n.store().barrier("up", me, 4, 30s);
  for (int j = 0; j < 4; ++j) {
    // Peers publish the address of their host, never the wildcard they bound.
    CHECK(n.store().get("troupe/addr/" + worker(j), 10s).rfind(troupe::test::netns_bed::addr(troupe::test::host_of(j)) + ":", 0) == 0);
    const auto answer = troupe::rpc_sync<std::string>(n, worker(j), "whoami", me);
    CHECK_THAT(answer, Catch::EndsWith(" answers " + std::to_string(me)));
    const bool other_host = troupe::test::host_of(j) != troupe::test::host_of(me);
    CHECK((answer.rfind(troupe::test::this_host() + " ", 0) != 0) == other_host);
  }
  troupe::generator g(static_cast<std::uint64_t>(me + 1));
  const auto big = troupe::randn({1 << 20}, g);  // 4 MB: fragments on the connection
  const int peer = (me + 2) % 4;                  // the rank at the same place on the other host
  CHECK(troupe::equal(troupe::rpc_sync<troupe::tensor>(n, worker(peer), "echo", big), big));
  if (me == 0) {
    // Note [fragments]: small calls written while a 64 MB request goes out in fragments pass
    // between them. They are read and served before the request is whole, and answer before
    // the echo.
    const auto huge = troupe::randn({16 << 20}, g);
    auto echo = troupe::rpc_async<troupe::tensor>(n, worker(peer), "echo_after_pings", huge);
    for (int i = 0; i < 3; ++i) CHECK(troupe::rpc_sync<int>(n, worker(peer), "ping", i) == i + 1);
    CHECK(troupe::equal(echo.get(), huge));
    CHECK(troupe::rpc_sync<int>(n, worker(peer), "pings_before_echo", 0) >= 1);
  }
  troupe::test::finish_rank(n);
}
