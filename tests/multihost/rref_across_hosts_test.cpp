// The four RRef sharing scenarios between namespace hosts (Note [RRef protocol]): owners on one
// host, users on the other, forks that cross back and forth.
#include <mutex>

#include <catch2/catch.hpp>

#include "multihost/rank_env.hpp"
#include "multihost/two_host_job.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/rref/rref.hpp"

using namespace std::chrono_literals;
using troupe::rref;
using troupe::test::worker;

TEST_CASE("rrefs cross hosts in the four sharing scenarios", "[multihost][rref]") {
  troupe::test::netns_bed bed(2);
  troupe::test::require_bed(bed);
  const auto r = troupe::test::run_two_host_job(bed, troupe::test::rank_program("[.mh_rref_rank]"));
  INFO(r.all());
  CHECK(r.codes == std::vector<int>{0, 0});
  for (const auto& out : r.outputs) CHECK_THAT(out, Catch::Contains("All tests passed") && !Catch::Contains("failed"));
}

// One rank (hidden). worker0 (host 0) drives; worker2 and worker3 (host 1) own; worker1 (host 0)
// keeps and passes on.
TEST_CASE("multihost rref rank: the four scenarios with owners on the other host", "[.mh_rref_rank]") {
  troupe::node n(troupe::test::rank_options());
  const int me = n.info().rank;
  {
    troupe::rref_context ctx(n);
    std::mutex mutex;
    rref<int> kept;
    troupe::add_function(ctx, "square", [](int x) { return x * x; });
    troupe::add_function(ctx, "mint", [&ctx](int v) { return troupe::make_rref(ctx, v); });
    troupe::add_function(ctx, "fetch", [](rref<int> r) { return r.to_here(5s); });
    troupe::add_function(ctx, "owned_value", [](rref<int> r) { return r.is_owner() ? r.local_value() : -1; });
    troupe::add_function(ctx, "keep", [&](rref<int> r) {
      std::lock_guard<std::mutex> lock(mutex);
      kept = std::move(r);
      return 0;
    });
    troupe::add_function(ctx, "give", [&]() {
      std::lock_guard<std::mutex> lock(mutex);
      return std::move(kept);
    });
    // On the owner: asks `holder` for the rref it keeps; true when it comes back as the owner's.
    troupe::add_function(ctx, "reclaim", [&ctx](std::string holder) {
      auto back = troupe::rpc_sync<rref<int>>(ctx, holder, "give");
      return back.is_owner() && back.local_value() == 36;
    });
    n.store().barrier("registered", me, 4, 30s);
    if (me == 0) {
      // user -> owner as argument: worker0 holds an rref owned by worker2 (other host).
      auto r = troupe::remote<int>(ctx, worker(2), "square", 6);
      CHECK(r.to_here(5s) == 36);
      CHECK(troupe::rpc_sync<int>(ctx, worker(2), "owned_value", r) == 36);
      // user -> user: worker0 passes it to worker3, which fetches from worker2; and to worker1
      // (this host), which fetches across hosts.
      CHECK(troupe::rpc_sync<int>(ctx, worker(3), "fetch", r) == 36);
      CHECK(troupe::rpc_sync<int>(ctx, worker(1), "fetch", r) == 36);
      // user -> owner as return value: worker1 keeps it, the owner worker2 gets it back.
      CHECK(troupe::rpc_sync<int>(ctx, worker(1), "keep", r) == 0);
      CHECK(troupe::rpc_sync<bool>(ctx, worker(2), "reclaim", std::string(worker(1))));
      // owner -> user: worker3 mints an rref it owns and returns it across hosts.
      auto minted = troupe::rpc_sync<rref<int>>(ctx, worker(3), "mint", 11);
      CHECK_FALSE(minted.is_owner());
      CHECK(minted.owner_name() == worker(3));
      CHECK(minted.to_here(5s) == 11);
      CHECK(troupe::rpc_sync<int>(ctx, worker(1), "fetch", minted) == 11);
    }
    n.store().barrier("scenarios", me, 4, 60s);
    {
      std::lock_guard<std::mutex> lock(mutex);
      kept = rref<int>();
    }
    // Every deletion reached its owner: nothing is left on any worker.
    CHECK(ctx.wait_quiescent(10s, true));
    CHECK(ctx.owner_count() == 0);
    n.store().barrier("released", me, 4, 30s);
  }
  troupe::test::finish_rank(n);
}
