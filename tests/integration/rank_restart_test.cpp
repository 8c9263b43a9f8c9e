// Tests of troupe-run --restart rank (Note [rank restart] in tools/troupe_run.cpp): the launcher
// restarts only the rank that died, and the others keep running.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <catch2/catch.hpp>

namespace {

struct run_result {
  int code = -1;
  std::string output;  // stdout and stderr together
};

// Runs troupe-run with `args` through the shell; every run is bounded by --timeout-s.
run_result launch(const std::string& args) {
  const std::string cmd = std::string(TROUPE_RUN_PATH) + " --timeout-s 60 " + args + " 2>&1";
  run_result r;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p)) r.output += buf;
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A fresh directory for the ranks' marker files, removed at the end.
struct scratch_dir {
  std::filesystem::path path = std::filesystem::temp_directory_path() / ("troupe_rank_restart_" + std::to_string(::getpid()));
  scratch_dir() { std::filesystem::create_directories(path); }
  ~scratch_dir() { std::filesystem::remove_all(path); }
};

}  // namespace

TEST_CASE("with --restart rank only the dead rank starts again and the others keep running", "[actors][launcher]") {
  // Rank 1 fails in its first incarnation; rank 0 waits (bounded) for the replacement's marker,
  // so it must have lived through the failure without a restart.
  scratch_dir d;
  const std::string m = (d.path / "replaced").string();
  const auto r = launch("--nproc-per-node 3 --restart rank --max-restarts 1 -- /bin/sh -c '"
                        "if [ $RANK = 1 ]; then [ $TROUPE_REPLACEMENT = 1 ] || exit 3; "
                        "echo rank1-count$TROUPE_RESTART_COUNT-replacement$TROUPE_REPLACEMENT; touch " + m + "; exit 0; fi; "
                        "i=0; while [ ! -f " + m + " ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; "
                        "[ -f " + m + " ] && echo rank$RANK-count$TROUPE_RESTART_COUNT-replacement$TROUPE_REPLACEMENT'");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(count(r.output, "rank0-count0-replacement0") == 1);
  CHECK(count(r.output, "rank2-count0-replacement0") == 1);
  CHECK(count(r.output, "rank1-count1-replacement1") == 1);
  CHECK_THAT(r.output, Catch::Contains("rank 1 (local rank 1") && Catch::Contains("restarting that rank alone (1 of 1)"));
  CHECK(count(r.output, "restarting every rank") == 0);
}

TEST_CASE("with --restart rank the death of rank 0 restarts every rank", "[actors][launcher]") {
  const auto r = launch("--nproc-per-node 2 --restart rank --max-restarts 1 -- /bin/sh -c '"
                        "if [ $TROUPE_RESTART_COUNT = 0 ]; then [ $RANK = 0 ] && exit 4; exec sleep 60; fi; "
                        "echo rank$RANK-count$TROUPE_RESTART_COUNT-replacement$TROUPE_REPLACEMENT'");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("restarting every rank (1 of 1)"));
  CHECK_THAT(r.output, Catch::Contains("rank0-count1-replacement0") && Catch::Contains("rank1-count1-replacement0"));
}

TEST_CASE("with --restart rank past the budget the launcher stops every rank and names the failure", "[actors][launcher]") {
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = launch("--nproc-per-node 2 --restart rank --max-restarts 1 -- /bin/sh -c '"
                        "if [ $RANK = 1 ]; then exit 5; fi; exec sleep 60'");
  INFO(r.output);
  CHECK(r.code == 1);
  CHECK(count(r.output, "restarting that rank alone") == 1);
  CHECK_THAT(r.output, Catch::Contains("exited with code 5") && Catch::Contains("no restarts left: 1 used"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30));
}

TEST_CASE("the launcher refuses a bad --restart and --restart rank on several hosts", "[actors][launcher]") {
  const auto bad = launch("--restart sometimes -- /bin/true");
  INFO(bad.output);
  CHECK(bad.code == 2);
  CHECK_THAT(bad.output, Catch::Contains("--restart needs job or rank, got 'sometimes'"));
  const auto hosts = launch("--restart rank --nnodes 2 --master-port 1 --job-token t -- /bin/true");
  INFO(hosts.output);
  CHECK(hosts.code == 2);
  CHECK_THAT(hosts.output, Catch::Contains("--restart rank runs on one host"));
}
