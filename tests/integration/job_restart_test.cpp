// Tests of the job-wide restart budget across launchers (Note [job restart] in
// tools/launcher/channel.hpp): two launchers of one job on this host, one rank each.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include <catch2/catch.hpp>

namespace {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

struct job_result {
  std::string output;  // node 1's output, then node 0's, then both exit codes
};

// Runs node 0 and node 1 of a 2-node job (1 rank each) with `flags`, running `script` in /bin/sh;
// both launchers are bounded by --timeout-s and both are waited for.
job_result run_two_nodes(const std::string& flags, const std::string& script) {
  const std::string port = std::to_string(free_port());
  auto node = [&](int k) {
    return std::string(TROUPE_RUN_PATH) + " --timeout-s 60 --nnodes 2 --nproc-per-node 1 --job-token t --master-port " + port +
           " --node-rank " + std::to_string(k) + " " + flags + " -- /bin/sh -c '" + script + "'";
  };
  const std::string log = "/tmp/troupe_job_restart_" + std::to_string(::getpid()) + ".log";
  const std::string cmd = "(" + node(0) + " > " + log + " 2>&1 & p=$!; " + node(1) + " 2>&1; echo node1=$?; wait $p; echo node0=$?; cat " +
                          log + "; rm -f " + log + ")";
  job_result r;
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) r.output += buf;
  ::pclose(p);
  return r;
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("a rank's death restarts the job on every host and the budget counts job restarts", "[actors][launcher]") {
  // Rank 1 (node 1) fails in attempts 0 and 1; the job succeeds in attempt 2 with a budget of 2.
  const auto r = run_two_nodes("--max-restarts 2",
                               "echo rank$RANK-attempt$TROUPE_RESTART_COUNT; "
                               "if [ $RANK = 1 ] && [ $TROUPE_RESTART_COUNT -lt 2 ]; then exit 3; fi");
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Contains("node1=0") && Catch::Contains("node0=0"));
  CHECK_THAT(r.output, Catch::Contains("rank0-attempt2") && Catch::Contains("rank1-attempt2"));
  CHECK_THAT(r.output, Catch::Contains("restarting every rank of the job (2 of 2)"));
}

TEST_CASE("ranks failing on both hosts in one attempt use one restart of the job", "[actors][launcher]") {
  const auto r = run_two_nodes("--max-restarts 1", "echo attempt$TROUPE_RESTART_COUNT; [ $TROUPE_RESTART_COUNT -ge 1 ]");
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Contains("node1=0") && Catch::Contains("node0=0"));
  CHECK(count(r.output, "restarting every rank of the job") == 1);
}

TEST_CASE("past the restart budget every launcher fails naming the rank and the cause", "[actors][launcher]") {
  const auto r = run_two_nodes("--max-restarts 1", "if [ $RANK = 1 ]; then exit 5; fi; exec sleep 30");
  INFO(r.output);
  CHECK_THAT(r.output, Catch::Contains("node1=1") && Catch::Contains("node0=1"));
  CHECK(count(r.output, "job failed: rank 1 (local rank 0") == 2);
  CHECK(count(r.output, "exited with code 5 (no restarts left: 1 used)") == 2);
}
