// The cluster fixture (troupe/actors/testing/cluster.hpp) with its ranks on namespace hosts.
#include <catch2/catch.hpp>

#include "multihost/netns_bed.hpp"
#include "multihost/rank_env.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/testing/cluster.hpp"

using namespace std::chrono_literals;

TEST_CASE("the cluster fixture places ranks on namespace hosts and they call each other across them", "[multihost][cluster]") {
  troupe::test::netns_bed bed(2);
  troupe::test::require_bed(bed);
  troupe::testing::cluster_options o;
  o.world = 4;
  o.hosts = {{bed.host_name(0), troupe::test::netns_bed::addr(0)}, {bed.host_name(1), troupe::test::netns_bed::addr(1)}};
  const auto r = troupe::testing::run_cluster(o, [&bed](troupe::node& n) {
    const int me = n.info().rank;
    n.functions().add("where", [] { return troupe::test::this_host(); });
    n.store().barrier("registered", me, 4, 20s);
    int wrong = troupe::test::this_host() == bed.host_name(me / 2) ? 0 : 1;
    for (int j = 0; j < 4; ++j)  // ranks 0, 1 on host 0; ranks 2, 3 on host 1
      if (troupe::rpc_sync<std::string>(n, troupe::test::worker(j), "where", 10s) != bed.host_name(j / 2)) ++wrong;
    n.store().barrier("called", me, 4, 20s);
    return wrong == 0 ? 0 : 10 + wrong;
  });
  INFO(r.describe());
  REQUIRE(r.finished_in_bound());
  CHECK(r.all_succeeded());
  CHECK(r.leaks.empty());
}

TEST_CASE("the cluster fixture refuses a host without a namespace or an address", "[multihost][cluster]") {
  troupe::testing::cluster_options o;
  o.hosts = {{"", "10.77.0.1"}};
  CHECK_THROWS_WITH(troupe::testing::run_cluster(o, [](troupe::node&) { return 0; }),
                    Catch::Contains("a host needs a network namespace and an address"));
}
