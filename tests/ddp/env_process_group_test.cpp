// A process group from the launcher environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// TROUPE_JOB_TOKEN) in one call, on spawned ranks.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>

#include "ddp/ddp_harness.hpp"
#include "troupe/actors/workers.hpp"
#include "troupe/ddp/env_process_group.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

/// In a spawned child: the variables a launcher sets.
void set_launcher_env(int rank, int world, std::uint16_t port) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("TROUPE_JOB_TOKEN", "env-test-token", 1);
}

}  // namespace

TEST_CASE("a process group forms from the launcher environment in one call", "[ddp][process_group]") {
  const std::uint16_t port = troupe::test::free_port();
  auto ctx = spawn(3, [port](int rank) {
    set_launcher_env(rank, 3, port);
    ddp::env_process_group dist("envtest");
    test::expect(dist.rank() == rank && dist.world_size() == 3, "rank and world size from the environment");
    test::expect(dist.node().info().name == "worker" + std::to_string(rank), "the node's worker name");
    tensor t = full({1000}, static_cast<double>(rank + 1));
    dist.group().allreduce(t).wait(20s);
    test::expect(t.data<float>()[999] == 6.0f, "allreduce over the group from the environment");
    const auto ws = workers(dist.node(), 20s);
    test::expect(ws.size() == 3 && ws[2].name == "worker2", "every rank in the worker list");
    auto pair = dist.new_group({0, 1});
    test::expect(pair.has_value() == (rank < 2), "subgroup membership");
    if (pair) {
      tensor u = ones({4});
      pair->allreduce(u).wait(20s);
      test::expect(u.data<float>()[0] == 2.0f, "allreduce over the subgroup");
    }
    pair.reset();
    dist.shutdown(20s);
    bool refused = false;
    try {
      dist.group();
    } catch (const error& e) {
      refused = e.code() == errc::invalid_state;
    }
    test::expect(refused, "group() after shutdown is invalid_state");
    dist.shutdown();  // idempotent
  });
  REQUIRE(ctx.join(90s));
}

TEST_CASE("a rank outside the world size is rejected before anything starts", "[ddp][process_group]") {
  node_options o;
  o.rank = 2;
  o.world_size = 2;
  try {
    ddp::env_process_group bad(o, "bad");
    FAIL("rank 2 of 2 should be rejected");
  } catch (const error& e) {
    CHECK(e.code() == errc::bad_argument);
    CHECK(e.message().find("RANK 2") != std::string::npos);
  }
}
