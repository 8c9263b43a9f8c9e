// examples/supervised_faults on two namespace hosts, one troupe-run per host. A kill comes at
// step 40, then host 1 is cut off at step 90. The launchers restart the job (a job-wide
// budget). It resumes from the checkpoint and ends with the undisturbed run's parameters.
#ifdef TROUPE_SUPERVISED_FAULTS_PATH
#include <filesystem>

#include <catch2/catch.hpp>

#include "multihost/netns_bed.hpp"

using namespace std::chrono_literals;

TEST_CASE("supervised_faults cuts a host off at step 90 and the restarted job ends with the undisturbed parameters",
          "[multihost][supervision]") {
  {
    troupe::test::netns_bed probe(1);  // the example makes its own bed; this one tells whether it can
    troupe::test::require_bed(probe);
  }
  const std::string out = "/tmp/troupe-mh-sf-" + std::to_string(::getpid());
  auto run = troupe::test::start_here({TROUPE_SUPERVISED_FAULTS_PATH, "--launcher", TROUPE_RUN_PATH, "--bed", TROUPE_NETNS_BED,
                                       "--out", out, "--steps", "100"},
                                      {"-u", "RANK", "-u", "WORLD_SIZE"});
  const int code = run.wait(110s);
  const std::string o = run.output();
  std::error_code ec;
  std::filesystem::remove_all(out, ec);
  INFO(o);
  CHECK(code == 0);
  CHECK_THAT(o, Catch::Contains("kill rank 1 at step 40 in forward; cut host 1 off at step 90 (attempt 1)"));
  // The cut fails the job with peer_lost naming the lost rank; the master launcher restarts it.
  CHECK_THAT(o, Catch::Contains("cut off: every packet dropped both ways") && Catch::Contains("rank 0 failed at step 90: peer_lost") &&
                    Catch::Contains("rank 1 (worker1)") && Catch::Contains("host 1 healed"));
  CHECK_THAT(o, Catch::Contains("restarting every rank of the job (2 of 3)"));
  CHECK_THAT(o, Catch::Contains("attempt 2: training resumed at step 81 from the checkpoint of step 80") &&
                    Catch::Contains("attempt 2: training finished at step 100"));
  CHECK_THAT(o, Catch::Contains("final parameters equal the undisturbed run's bit for bit"));
}
#endif
