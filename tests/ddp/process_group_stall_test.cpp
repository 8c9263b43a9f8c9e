// Process groups built on a node's store use the node's peer-loss detection (Note [group peer
// loss]). A frozen rank fails the collectives of every other rank within the rpc bound. A
// stall shorter than the peer timeout loses nothing. Three nodes: the parent is rank 0.
#include <catch2/catch.hpp>
#include <optional>
#include <thread>

#include "integration/node_harness.hpp"
#include "integration/stall_probe.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/ddp/process_group.hpp"
#include "troupe/tensors/factories.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

ddp::process_group_options group_options(ddp::transport_kind kind) {
  ddp::process_group_options o;
  o.transport = kind;
  o.timeout = 10s;  // the collective timeout the loss must beat by far
  o.shared_arena_bytes = 0;
  return o;
}

// Allreduces rank+1 on a 1 KiB tensor; returns the sum seen.
double allreduce_ranks(ddp::process_group& pg) {
  auto t = full({256}, static_cast<double>(pg.rank() + 1), {dtype::float32});
  pg.allreduce(t).wait(20s);
  return static_cast<double>(t.data<float>()[255]);
}

// How a stall test runs: the group kind, whether rank 2 stays frozen, how long a peer may stay
// silent before its node declares it lost.
struct stall_plan {
  ddp::transport_kind kind = ddp::transport_kind::shared_memory;
  bool frozen_for_good = true;
  bool subgroup = false;  // ranks 0 and 2 run the second allreduce in new_group({0, 2})
  std::chrono::milliseconds peer_timeout{1000};
};

node_options stall_options(int rank, std::uint16_t port, const stall_plan& plan) {
  auto o = troupe::test::test_options(rank, 3, port);
  o.connection_timeout = plan.peer_timeout;
  return o;
}

// Ranks 1 and 2 of the stall tests. Rank 2 stops where the parent freezes it: before the second
// allreduce when `frozen_for_good`, else it joins that allreduce once it runs again.
void stall_rank(int rank, troupe::test::port_pipe& pipe, troupe::test::stall_probe& probe, const stall_plan& plan) {
  troupe::node n(stall_options(rank, pipe.read(), plan));
  ddp::process_group pg(n.store(), rank, 3, "stall", group_options(plan.kind));
  if (allreduce_ranks(pg) != 6.0) throw error(errc::invalid_state, "first allreduce is wrong");
  std::optional<ddp::process_group> sub;
  if (plan.subgroup) sub = pg.new_group(n.store(), {0, 2}, group_options(plan.kind));
  n.store().set("ready/" + std::to_string(rank), "1");
  try {
    n.store().get("go", 30s);  // rank 2 is frozen here
  } catch (const error&) {
    if (rank != 2) throw;  // a rank thawed after its loss may find the store host gone
  }
  if (rank == 2 && plan.frozen_for_good) {
    n.store().get("never", 30s);
    return;
  }
  try {
    auto& group = sub ? *sub : pg;
    const double sum = allreduce_ranks(group);
    probe.report_outcome(rank, nullptr, 0, sum == (sub ? 4.0 : 6.0));
  } catch (const error& e) {
    probe.report_outcome(rank, &e);
  }
  try {
    n.store().get("done", 30s);
  } catch (const error&) {
    if (rank != 2) throw;
  }
}

// Rank 0 (the parent): starts the ranks, freezes rank 2 and runs the second allreduce.
struct stall_run {
  troupe::test::port_pipe pipe;
  troupe::test::stall_probe probe;
  spawn_context children;
  std::unique_ptr<troupe::node> n;
  std::unique_ptr<ddp::process_group> pg;
  std::optional<ddp::process_group> sub;

  explicit stall_run(const stall_plan& plan)
      : children(spawn_children(2, [this, plan](int c) { stall_rank(c + 1, pipe, probe, plan); })) {
    n = std::make_unique<troupe::node>(stall_options(0, 0, plan));
    pipe.publish(n->port(), 2);
    pg = std::make_unique<ddp::process_group>(n->store(), 0, 3, "stall", group_options(plan.kind));
    REQUIRE(allreduce_ranks(*pg) == 6.0);
    if (plan.subgroup) sub = pg->new_group(n->store(), {0, 2}, group_options(plan.kind));
    n->store().wait({"ready/1", "ready/2"}, 20s);
    REQUIRE(troupe::test::freeze(children.pids()[1]));
    probe.stamp();
    n->store().set("go", "1");
  }
  ~stall_run() {
    ::kill(children.pids()[1], SIGCONT);
    if (n) n->store().set("done", "1");
  }
  ddp::process_group& group() { return sub ? *sub : *pg; }
};

void expect_frozen_rank_named(const stall_plan& plan, const char* what) {
  stall_run run(plan);
  std::optional<error> mine;
  try {
    allreduce_ranks(run.group());
  } catch (const error& e) {
    mine = e;
  }
  const double my_ms = run.probe.ms_since();
  REQUIRE(mine.has_value());
  INFO(what << ", rank 0: " << mine->message());
  CHECK(mine->code() == errc::peer_lost);
  CHECK_THAT(mine->message(), Catch::Contains("worker2"));
  CHECK(my_ms < 3000);
  WARN(what << ": peer_lost " << my_ms << " ms after the SIGSTOP, on rank 0");
  const auto r = run.probe.read(20s);
  INFO(what << ", rank 1: " << r.text);
  CHECK(r.code == static_cast<int>(errc::peer_lost));
  CHECK_THAT(std::string(r.text), Catch::Contains("rank 2") && Catch::Contains("worker2"));
  CHECK(r.ms < 3000);
  WARN(what << ": peer_lost " << r.ms << " ms after the SIGSTOP, on rank 1");
  // A later collective fails at once, naming the same rank.
  auto t = zeros({4});
  const auto t0 = std::chrono::steady_clock::now();
  try {
    run.group().allreduce(t).wait(20s);
    FAIL("an allreduce after the loss succeeded");
  } catch (const error& e) {
    CHECK(e.code() == errc::peer_lost);
    CHECK_THAT(e.message(), Catch::Contains("worker2"));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  ::kill(run.children.pids()[1], SIGKILL);
}

}  // namespace

TEST_CASE("a SIGSTOPped rank fails a pending allreduce on every other rank with peer_lost naming it (shared memory)",
          "[ddp][process_group][supervision]") {
  expect_frozen_rank_named({ddp::transport_kind::shared_memory}, "shm group, frozen rank");
}

TEST_CASE("a SIGSTOPped rank fails a pending allreduce on every other rank with peer_lost naming it (tcp)",
          "[ddp][process_group][tcp][supervision]") {
  expect_frozen_rank_named({ddp::transport_kind::tcp}, "tcp group, frozen rank");
}

TEST_CASE("a SIGSTOPped rank fails a pending allreduce of a subgroup from new_group with peer_lost naming it",
          "[ddp][process_group][supervision]") {
  auto kind = GENERATE(ddp::transport_kind::shared_memory, ddp::transport_kind::tcp);
  expect_frozen_rank_named({kind, true, true}, kind == ddp::transport_kind::tcp ? "tcp subgroup, frozen rank" : "shm subgroup, frozen rank");
}

TEST_CASE("a 2 s stall shorter than the peer timeout loses nothing: the allreduce completes on every rank",
          "[ddp][process_group][supervision]") {
  auto kind = GENERATE(ddp::transport_kind::shared_memory, ddp::transport_kind::tcp);
  stall_run run({kind, false, false, 5000ms});
  auto t = full({256}, 1.0, {dtype::float32});
  auto w = run.pg->allreduce(t);
  // The stall itself: rank 2 stays stopped for 2 s (the peer timeout is 5 s) while ranks 0 and
  // 1 wait for it inside the allreduce.
  std::this_thread::sleep_for(2s);
  REQUIRE(::kill(run.children.pids()[1], SIGCONT) == 0);
  REQUIRE_NOTHROW(w.wait(20s));
  CHECK(t.data<float>()[0] == 6.0f);
  for (int i = 0; i < 2; ++i) {
    const auto r = run.probe.read(20s);
    INFO("rank " << r.rank << ": " << r.text);
    CHECK(r.code == 0);
    CHECK(r.ok);
  }
}

TEST_CASE("a rank stopped longer than the peer timeout and resumed finds its group failed, like every other rank",
          "[ddp][process_group][supervision]") {
  auto kind = GENERATE(ddp::transport_kind::shared_memory, ddp::transport_kind::tcp);
  stall_run run({kind, false, false, 1000ms});
  auto t = full({256}, 1.0, {dtype::float32});
  auto w = run.pg->allreduce(t);
  // Rank 0 learns of the loss first; only then does rank 2 run again.
  try {
    w.wait(20s);
    FAIL("the allreduce with a frozen rank succeeded");
  } catch (const error& e) {
    CHECK(e.code() == errc::peer_lost);
    CHECK_THAT(e.message(), Catch::Contains("worker2"));
  }
  CHECK(run.probe.ms_since() < 3000);
  REQUIRE(::kill(run.children.pids()[1], SIGCONT) == 0);
  run.probe.stamp();
  // Ranks 1 and 2 both end their allreduce with peer_lost: nobody stays half-connected.
  for (int i = 0; i < 2; ++i) {
    const auto r = run.probe.read(20s);
    INFO("rank " << r.rank << ": " << r.text);
    CHECK(r.code == static_cast<int>(errc::peer_lost));
    CHECK_FALSE(r.ok);
    if (r.rank == 2) CHECK(r.ms < 5000);  // the resumed rank: well before the 10 s collective timeout
  }
  // The group stays failed on rank 0 (make a new group): a later collective fails at once.
  auto later = zeros({4});
  CHECK_THROWS_AS(run.pg->allreduce(later).wait(5s), error);
}
