// An NCCL group built on a node's store fails its collectives with peer_lost when the node loses
// a member (Note [group peer loss]). NCCL takes one device per rank, so these tests need two
// CUDA devices (rank r on cuda:r) and skip visibly with fewer. The rank in the child is a fresh
// process (exec_children): CUDA does not survive fork.
#include <catch2/catch.hpp>
#include <signal.h>

#include <chrono>

#include "integration/exec_child.hpp"
#include "integration/node_harness.hpp"
#include "troupe/ddp/nccl_process_group.hpp"
#include "troupe/tensors/cuda.hpp"
#include "troupe/tensors/factories.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

bool fewer_than_two_devices() {
  if (ddp::nccl_compiled() && cuda::device_count() >= 2) return false;
  WARN("fewer than two CUDA devices or no NCCL in this build: skipped (NCCL refuses two ranks on one device)");
  return true;
}

ddp::process_group_options loss_options() {
  ddp::process_group_options o;
  o.timeout = 30s;  // the collective timeout the loss must beat by far
  return o;
}

node_options loss_node(int rank, std::uint16_t port) {
  auto o = troupe::test::test_options(rank, 2, port);
  o.connection_timeout = 1s;
  return o;
}

// Every rank's allreduce of ones: 2 on both.
void allreduce_ones(ddp::nccl_process_group& pg) {
  tensor t = ones({1024}, {dtype::float32, pg.device()});
  pg.allreduce(t).wait(30s);
  if (t.cpu().data<float>()[1023] != 2.0f) throw error(errc::invalid_state, "the first allreduce gave a wrong sum");
}

void expect_loss_named(int sig) {
  node n(loss_node(0, 0));
  auto child = troupe::test::exec_children(1, "child: an nccl rank that waits to be stopped",
                                           {{"TROUPE_TEST_PORT", std::to_string(n.port())}});
  ddp::nccl_process_group pg(n.store(), 0, 2, "loss", cuda_device(0), loss_options());
  allreduce_ones(pg);
  n.store().wait({"ready/1"}, 30s);
  child.kill(0, sig);
  const auto t0 = std::chrono::steady_clock::now();
  tensor t = ones({1 << 20}, {dtype::float32, cuda_device(0)});
  try {
    pg.allreduce(t).wait(20s);
    FAIL("the allreduce with a lost rank succeeded");
  } catch (const error& e) {
    INFO(e.message());
    CHECK(e.code() == errc::peer_lost);
    CHECK_THAT(e.message(), Catch::Contains("rank 1") && Catch::Contains("worker1"));
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  CHECK(ms < 4000);  // connection_timeout (1 s, a frozen rank) plus one watchdog tick (1.5 s)
  WARN("peer_lost " << ms << " ms after " << signal_name(sig));
  CHECK(pg.failure().has_value());
  child.kill(0, SIGKILL);
}

}  // namespace

TEST_CASE("a SIGKILLed rank fails a pending nccl allreduce on the other rank with peer_lost naming it", "[ddp][nccl][multigpu]") {
  if (fewer_than_two_devices()) return;
  expect_loss_named(SIGKILL);
}

TEST_CASE("a SIGSTOPped rank fails a pending nccl allreduce on the other rank with peer_lost naming it", "[ddp][nccl][multigpu]") {
  if (fewer_than_two_devices()) return;
  expect_loss_named(SIGSTOP);
}

TEST_CASE("child: an nccl rank that waits to be stopped", "[.]") {
  if (troupe::test::child_rank() == 0) return;
  const auto port = static_cast<std::uint16_t>(std::stoi(troupe::test::child_env("TROUPE_TEST_PORT")));
  node n(loss_node(1, port));
  ddp::nccl_process_group pg(n.store(), 1, 2, "loss", cuda_device(1), loss_options());
  allreduce_ones(pg);
  n.store().set("ready/1", "1");
  n.store().get("never", 60s);  // stopped or killed here
}
