// Cuts and dropped heartbeats that outlast the peer timeout (Note [silent peers]), and delays at
// fault points.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>

#include "troupe/actors/fault_plan.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/testing/cluster.hpp"

using namespace std::chrono_literals;
using troupe::errc;

namespace {

// A plan file in the temp directory, removed with the guard.
struct plan_file {
  std::filesystem::path path;
  explicit plan_file(const std::string& text) {
    static int n = 0;
    path = std::filesystem::temp_directory_path() / ("troupe-silent-" + std::to_string(::getpid()) + "-" + std::to_string(n++) + ".txt");
    std::ofstream(path) << text;
  }
  ~plan_file() { std::filesystem::remove(path); }
};

// Three ranks; rank 1 calls rank 2's `hold` (which waits for the key "release") under `plan`.
// Rank 1 exits 0 when the call fails with peer_lost naming worker2 well before its timeout.
troupe::testing::cluster_result call_across(const std::string& plan) {
  plan_file f(plan);
  troupe::testing::cluster_options o;
  o.world = 3;
  o.peer_timeout = 1000ms;
  o.plan_file = f.path.string();
  return troupe::testing::run_cluster(o, [](troupe::node& n) {
    if (n.info().rank == 2) {
      n.functions().add("hold", [&n] {
        n.store().get("release", 20s);
        return 1;
      });
      n.store().set("ready", "1");
    }
    if (n.info().rank != 1) {
      n.store().get("done", 25s);
      return 0;
    }
    n.store().get("ready", 20s);
    int code = 0;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      troupe::rpc_sync<int>(n, "worker2", "hold", 15s);
      code = 3;  // the call went through: wrong
    } catch (const troupe::error& e) {
      const bool names = e.message().find("worker2") != std::string::npos;
      code = e.code() != errc::peer_lost ? 4 : !names ? 5 : std::chrono::steady_clock::now() - t0 > 8s ? 6 : 0;
      if (code != 0) std::fprintf(stderr, "rank 1: %s\n", e.what());
    }
    n.store().set("release", "1");
    n.store().set("done", "1");
    return code;
  });
}

}  // namespace

TEST_CASE("a plan parses dropped heartbeats and delays and prints them back", "[fault][plan]") {
  const auto plan = troupe::fault_plan::parse("drop_heartbeats worker1 worker0,worker2 for=900\ndelay allreduce step=4 for=250 worker=worker3\n");
  REQUIRE(plan.silences.size() == 1);
  CHECK(plan.silences[0].to == std::vector<std::string>{"worker0", "worker2"});
  CHECK(plan.silences[0].duration == 900ms);
  REQUIRE(plan.points.size() == 1);
  CHECK(plan.points[0].action == troupe::point_action::delay);
  CHECK(troupe::fault_plan::parse(plan.to_string()).to_string() == plan.to_string());
  CHECK_THROWS_WITH(troupe::fault_plan::parse("delay step step=1\n"), Catch::Contains("line 1") && Catch::Contains("for=MS"));
  CHECK_THROWS_WITH(troupe::fault_plan::parse("drop_heartbeats a\n"), Catch::Contains("two worker lists"));
}

TEST_CASE("a dropping cut and lost heartbeats silence a peer, a held cut does not", "[fault][plan]") {
  troupe::fault_injector cut(troupe::fault_plan::parse("partition worker0 worker1\n"));
  CHECK(cut.may_silence());
  CHECK(cut.silent_since("worker0", "worker1"));
  CHECK(cut.silent_since("worker1", "worker0"));
  CHECK_FALSE(cut.silent_since("worker0", "worker2"));
  cut.heal();
  CHECK_FALSE(cut.silent_since("worker0", "worker1"));
  troupe::fault_injector held(troupe::fault_plan::parse("partition worker0 worker1 for=5000 hold\n"));
  CHECK_FALSE(held.may_silence());
  CHECK_FALSE(held.silent_since("worker0", "worker1"));
  troupe::fault_injector deaf(troupe::fault_plan::parse("drop_heartbeats worker0 worker1\n"));
  CHECK(deaf.silent_since("worker0", "worker1"));
  CHECK_FALSE(deaf.silent_since("worker1", "worker0"));  // one direction only
}

TEST_CASE("a delay at a fault point blocks only the thread that reaches it", "[fault][plan]") {
  troupe::fault_injector inj(troupe::fault_plan::parse("delay allreduce step=2 for=300 worker=worker1\n"));
  const auto t0 = std::chrono::steady_clock::now();
  inj.on_point("worker1", "allreduce", 1);
  inj.on_point("worker0", "allreduce", 2);
  CHECK(std::chrono::steady_clock::now() - t0 < 250ms);
  inj.on_point("worker1", "allreduce", 2);
  CHECK(std::chrono::steady_clock::now() - t0 >= 300ms);
  CHECK(inj.counters().points_fired == 1);
}

TEST_CASE("a cut that outlasts the peer timeout fails a call across it with peer_lost naming the peer", "[fault][plan][cluster]") {
  const auto r = call_across("partition worker1 worker2\n");
  INFO(r.describe());
  REQUIRE(r.finished_in_bound());
  CHECK(r.all_succeeded());
  CHECK(r.leaks.empty());
}

TEST_CASE("a peer whose heartbeats are dropped is declared lost and its call fails with peer_lost", "[fault][plan][cluster]") {
  const auto r = call_across("drop_heartbeats worker2 worker1\n");
  INFO(r.describe());
  REQUIRE(r.finished_in_bound());
  CHECK(r.all_succeeded());
  CHECK(r.leaks.empty());
}
