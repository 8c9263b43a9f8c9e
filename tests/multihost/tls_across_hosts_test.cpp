// A job under mutual TLS between namespace hosts (Note [tls relay]): 2 hosts x 2 ranks started by
// troupe-run with --tls-*, RPC, the store and large tensors across hosts.
#include <catch2/catch.hpp>

#include "ddp/tls_test_certs.hpp"
#include "multihost/rank_env.hpp"
#include "multihost/two_host_job.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"

using namespace std::chrono_literals;

TEST_CASE("a TLS job crosses hosts: rpc and the store and large tensors go through TLS", "[multihost][tls]") {
  troupe::test::netns_bed bed(2);
  troupe::test::require_bed(bed);
  const troupe::test::tls_test_certs certs;
  const auto t = certs.options();
  const auto r = troupe::test::run_two_host_job(bed, troupe::test::rank_program("[.mh_tls_rank]"), 60s,
                                                {"--listen-addr=0.0.0.0", "--tls-cert", t.cert_file, "--tls-key", t.key_file, "--tls-ca", t.ca_file});
  INFO(r.all());
  CHECK(r.codes == std::vector<int>{0, 0});
  for (const auto& out : r.outputs) CHECK_THAT(out, Catch::Contains("All tests passed") && !Catch::Contains("failed"));
}

// One rank of the job above (hidden: run by the launcher only).
TEST_CASE("multihost tls rank: call every rank and use the store and echo 4 MB across hosts", "[.mh_tls_rank]") {
  using troupe::test::worker;
  troupe::rpc::registry reg;
  reg.add("whoami", [](int from) { return troupe::test::this_host() + " answers " + std::to_string(from); });
  reg.add("echo", [](troupe::tensor t) { return t; });
  const auto o = troupe::test::rank_options();
  REQUIRE(o.tls.enabled());  // troupe-run passed the certificates on
  troupe::node n(o, reg);
  const int me = n.info().rank;
  REQUIRE(n.info().world_size == 4);
  n.store().set("tls/" + std::to_string(me), "from " + troupe::test::this_host());
  n.store().barrier("up", me, 4, 30s);
  for (int j = 0; j < 4; ++j) {
    CHECK_THAT(troupe::rpc_sync<std::string>(n, worker(j), "whoami", me), Catch::EndsWith(" answers " + std::to_string(me)));
    CHECK(n.store().get("tls/" + std::to_string(j), 10s).rfind("from ", 0) == 0);
  }
  troupe::generator g(static_cast<std::uint64_t>(me + 1));
  const auto big = troupe::randn({1 << 20}, g);  // 4 MB: fragments through TLS
  const int peer = (me + 2) % 4;                  // the rank at the same place on the other host
  CHECK(troupe::equal(troupe::rpc_sync<troupe::tensor>(n, worker(peer), "echo", big), big));
  troupe::test::finish_rank(n);
}
