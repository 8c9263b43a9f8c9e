// Tests of the troupe-run launcher (Note [launcher] in tools/troupe_run.cpp). The launcher runs
// /bin/sh one-liners, and this test binary itself as a real multi-rank job (a hidden test case).
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

#include "troupe/actors/node.hpp"
#include "troupe/actors/rpc/api.hpp"

using namespace std::chrono_literals;

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

std::string self_exe() {
  char buf[4096];
  const auto n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  REQUIRE(n > 0);
  return std::string(buf, static_cast<std::size_t>(n));
}

}  // namespace

TEST_CASE("the launcher gives every rank the launcher environment", "[actors][launcher]") {
  const auto r = launch("--nproc-per-node 3 -- /bin/sh -c "
                        "'test \"$WORLD_SIZE\" = 3 && test \"$LOCAL_RANK\" = \"$RANK\" && test -n \"$TROUPE_JOB_TOKEN\" "
                        "&& test \"$MASTER_ADDR\" = 127.0.0.1 && test \"$MASTER_PORT\" -gt 0 && echo rank$RANK'");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("rank0") && Catch::Contains("rank1") && Catch::Contains("rank2"));
}

TEST_CASE("a failing rank stops the job and the launcher names it", "[actors][launcher]") {
  // Rank 1 fails at once; ranks 0 and 2 would sleep for a minute and must be stopped.
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = launch("--nproc-per-node 3 -- /bin/sh -c 'if [ \"$RANK\" = 1 ]; then exit 7; fi; exec sleep 60'");
  INFO(r.output);
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("rank 1") && Catch::Contains("7"));
  CHECK(std::chrono::steady_clock::now() - t0 < 20s);
}

TEST_CASE("the launcher restarts every rank after a failure while restarts are left", "[actors][launcher]") {
  // The first attempt fails on rank 0; the second succeeds (TROUPE_RESTART_COUNT tells them apart).
  const auto ok = launch("--nproc-per-node 2 --max-restarts 1 -- /bin/sh -c "
                         "'if [ \"$TROUPE_RESTART_COUNT\" = 0 ] && [ \"$RANK\" = 0 ]; then exit 3; fi; echo attempt$TROUPE_RESTART_COUNT'");
  INFO(ok.output);
  CHECK(ok.code == 0);
  CHECK_THAT(ok.output, Catch::Contains("restarting every rank (1 of 1)") && Catch::Contains("attempt1"));
  const auto out = launch("--nproc-per-node 2 --max-restarts 1 -- /bin/sh -c 'exit 4'");
  CHECK(out.code == 1);
  CHECK_THAT(out.output, Catch::Contains("exited with code 4") && Catch::Contains("no restarts left: 1 used"));
}

TEST_CASE("the launcher refuses bad options with a clear message", "[actors][launcher]") {
  const auto r = launch("--nproc-per-node zero -- /bin/true");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("--nproc-per-node needs an integer"));
  const auto missing = launch("--nproc-per-node 1 -- /nonexistent/program");
  CHECK(missing.code == 1);
  CHECK_THAT(missing.output, Catch::Contains("cannot execute '/nonexistent/program'"));
}

TEST_CASE("ranks started by the launcher form a job and call each other", "[actors][launcher]") {
  const auto r = launch("--nproc-per-node 3 -- " + self_exe() + " \"[launcher_rank]\"");
  INFO(r.output);
  CHECK(r.code == 0);
  // Each rank ran the hidden test case (not "no test cases matched").
  CHECK_THAT(r.output, Catch::Contains("in 1 test case"));
}

// Run by the launcher only (hidden tag): one rank of a job configured by the environment.
TEST_CASE("launcher rank: join from the environment and call the next rank", "[.launcher_rank]") {
  troupe::rpc::registry reg;
  reg.add("whoami", [](int from) { return std::getenv("RANK") + std::string(" answered ") + std::to_string(from); });
  troupe::node n(troupe::node_options::from_env(), reg);
  const auto& me = n.info();
  REQUIRE(me.world_size == 3);
  const int next = (me.rank + 1) % me.world_size;
  n.store().barrier("up", me.rank, me.world_size, 20s);
  const auto answer = troupe::rpc_sync<std::string>(n, "worker" + std::to_string(next), "whoami", me.rank);
  CHECK(answer == std::to_string(next) + " answered " + std::to_string(me.rank));
  n.shutdown(troupe::shutdown_mode::graceful, 20s);
}

TEST_CASE("the launcher takes torchrun's spellings: underscores, --flag=value, --standalone, no --", "[actors][launcher]") {
  const auto r = launch("--standalone --nproc_per_node=2 --max_restarts=0 /bin/sh -c "
                        "'test \"$WORLD_SIZE\" = 2 && test \"$MASTER_ADDR\" = 127.0.0.1 && test \"$MASTER_PORT\" -gt 0 "
                        "&& test \"$TROUPE_LISTEN_ADDR\" = 127.0.0.1 && echo spelled$RANK'");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("spelled0") && Catch::Contains("spelled1"));
  const auto endpoint = launch("--nproc-per-node 1 --rdzv-endpoint=127.0.0.1:0 --rdzv_backend c10d --rdzv-id job7 -- /bin/sh -c "
                               "'test \"$MASTER_ADDR\" = 127.0.0.1 && echo endpoint-ok'");
  INFO(endpoint.output);
  CHECK(endpoint.code == 0);
  CHECK_THAT(endpoint.output, Catch::Contains("endpoint-ok"));
}

TEST_CASE("a single-node job draws its own job token, a given one is passed on", "[actors][launcher]") {
  const auto a = launch("--nproc-per-node 1 -- /bin/sh -c 'echo token=$TROUPE_JOB_TOKEN'");
  const auto b = launch("--nproc-per-node 1 -- /bin/sh -c 'echo token=$TROUPE_JOB_TOKEN'");
  CHECK(a.code == 0);
  CHECK(a.output != b.output);
  const auto given = launch("--nproc-per-node 1 --job-token=given-token -- /bin/sh -c 'echo token=$TROUPE_JOB_TOKEN'");
  CHECK_THAT(given.output, Catch::Contains("token=given-token"));
}

TEST_CASE("the launcher refuses torchrun forms it does not support with exit code 2", "[actors][launcher]") {
  const auto elastic = launch("--nnodes 1:4 --nproc-per-node 1 /bin/true");
  CHECK(elastic.code == 2);
  CHECK_THAT(elastic.output, Catch::Contains("elastic node counts are not supported"));
  const auto no_token = launch("--nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port 29400 /bin/true");
  CHECK(no_token.code == 2);
  CHECK_THAT(no_token.output, Catch::Contains("needs one job token on every node"));
  const auto bad_endpoint = launch("--rdzv-endpoint nohostport /bin/true");
  CHECK(bad_endpoint.code == 2);
  CHECK_THAT(bad_endpoint.output, Catch::Contains("--rdzv-endpoint needs host:port"));
}
