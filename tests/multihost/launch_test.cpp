// troupe-run across namespace hosts (Note [launcher], Note [launcher channel]): torchrun's
// spellings, one job token, the addresses each rank gets, and a failure on one host relayed to
// every launcher.
#include <unistd.h>

#include <cstdio>
#include <thread>

#include <catch2/catch.hpp>

#include "multihost/two_host_job.hpp"

using namespace std::chrono_literals;
using troupe::test::netns_bed;

TEST_CASE("launchers on two hosts form one job and give every rank its place and addresses", "[multihost][launcher]") {
  netns_bed bed(2);
  troupe::test::require_bed(bed);
  // Each rank checks its environment and prints what it got.
  const auto r = troupe::test::run_two_host_job(
      bed, {"/bin/sh", "-c",
            "test \"$WORLD_SIZE\" = 4 && test \"$LOCAL_WORLD_SIZE\" = 2 && test \"$MASTER_ADDR\" = 10.77.0.1 && "
            "test \"$MASTER_PORT\" -gt 0 && test \"$MASTER_PORT\" != 29400 && test \"$TROUPE_JOB_TOKEN\" = mh-job-token && "
            "echo \"rank $RANK local $LOCAL_RANK listens on $TROUPE_LISTEN_ADDR on $(hostname)\""});
  INFO(r.all());
  CHECK(r.codes == std::vector<int>{0, 0});
  CHECK_THAT(r.outputs[0], Catch::Contains("rank 0 local 0 listens on 10.77.0.1 on " + bed.host_name(0)) &&
                               Catch::Contains("rank 1 local 1 listens on 10.77.0.1 on " + bed.host_name(0)));
  CHECK_THAT(r.outputs[1], Catch::Contains("rank 2 local 0 listens on 10.77.0.2 on " + bed.host_name(1)) &&
                               Catch::Contains("rank 3 local 1 listens on 10.77.0.2 on " + bed.host_name(1)));
}

TEST_CASE("a rank failing on one host stops the job on every host and every launcher names rank, host and cause",
          "[multihost][launcher]") {
  netns_bed bed(2);
  troupe::test::require_bed(bed);
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = troupe::test::run_two_host_job(bed, {"/bin/sh", "-c", "if [ \"$RANK\" = 3 ]; then exit 7; fi; exec sleep 60"});
  INFO(r.all());
  CHECK(r.codes == std::vector<int>{1, 1});
  for (const auto& out : r.outputs)
    CHECK_THAT(out, Catch::Contains("job failed: rank 3 (local rank 1") && Catch::Contains("on host " + bed.host_name(1)) &&
                        Catch::Contains("exited with code 7"));
  CHECK(std::chrono::steady_clock::now() - t0 < 30s);
}

TEST_CASE("a node with another job token is refused and the master names the node that did not join", "[multihost][launcher]") {
  netns_bed bed(2);
  troupe::test::require_bed(bed);
  const std::vector<std::string> prog{"/bin/true"};
  auto master = bed.start(0, troupe::test::launcher_argv(bed, 0, 1, prog, 30, {"--join-timeout-s=3"}), {"TROUPE_JOB_TOKEN=right"});
  auto other = bed.start(1, troupe::test::launcher_argv(bed, 1, 1, prog, 30), {"TROUPE_JOB_TOKEN=wrong"});
  CHECK(other.wait(20s) == 1);
  CHECK(master.wait(20s) == 1);
  INFO(master.output() << other.output());
  CHECK_THAT(other.output(), Catch::Contains("refused node 1: the job token differs"));
  CHECK_THAT(master.output(), Catch::Contains("only 1 of 2 nodes joined") && Catch::Contains("missing node ranks 1"));
}

TEST_CASE("a host whose launcher dies is named by the other launchers, which stop their ranks", "[multihost][launcher]") {
  netns_bed bed(2);
  troupe::test::require_bed(bed);
  // Every rank marks that it runs, then sleeps; host 1's launcher is killed once all four run.
  const std::string marks = "/tmp/" + bed.prefix() + "-up";
  const std::vector<std::string> prog{"/bin/sh", "-c", "touch " + marks + "$RANK; exec sleep 60"};
  std::vector<troupe::test::host_process> ps;
  for (int h = 0; h < 2; ++h)
    ps.push_back(bed.start(h, troupe::test::launcher_argv(bed, h, 2, prog, 60), {"TROUPE_JOB_TOKEN=mh-job-token"}));
  const auto end = std::chrono::steady_clock::now() + 40s;
  auto all_up = [&] {
    for (int r = 0; r < 4; ++r)
      if (::access((marks + std::to_string(r)).c_str(), F_OK) != 0) return false;
    return true;
  };
  while (!all_up() && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(10ms);  // polling files
  REQUIRE(all_up());
  const auto t0 = std::chrono::steady_clock::now();
  ps[1].signal(SIGKILL);
  CHECK(ps[0].wait(20s) == 1);
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  INFO(ps[0].output());
  CHECK_THAT(ps[0].output(), Catch::Contains("job failed: the launcher of node 1 on host " + bed.host_name(1) + " was lost"));
  for (int r = 0; r < 4; ++r) std::remove((marks + std::to_string(r)).c_str());
}
