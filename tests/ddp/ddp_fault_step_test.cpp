// The library's DDP fault points report the loop's step. The n-th forward of a rank is step n
// for the forward point, and for the backward and allreduce points of the backward it armed.
// That holds on every rank and every bucket thread. A plan's kill at a DDP point fires at that
// step.

#include <sys/mman.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>

#include "ddp/ddp_test_util.hpp"
#include "troupe/actors/fault_plan.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

/// Counters in shared memory, written by the children and read by the parent.
struct shared_counters {
  std::atomic<std::int64_t> loop_step[2];     // the step each rank's loop is in
  std::atomic<std::int64_t> allreduce_at[2];  // the step of each rank's last allreduce point
};

class shared_block {
 public:
  shared_block()
      : p_(static_cast<shared_counters*>(
            ::mmap(nullptr, sizeof(shared_counters), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0))) {
    if (p_ == MAP_FAILED) throw error(errc::io_error, "shared_block: mmap failed");
    for (int r = 0; r < 2; ++r) p_->loop_step[r] = p_->allreduce_at[r] = -1;
  }
  ~shared_block() { ::munmap(p_, sizeof(shared_counters)); }
  shared_block(const shared_block&) = delete;
  shared_block& operator=(const shared_block&) = delete;
  shared_counters* operator->() const { return p_; }

 private:
  shared_counters* p_;
};

ddp::ddp_options one_bucket_per_parameter() {
  ddp::ddp_options opts;
  opts.bucket_cap_mb = opts.first_bucket_cap_mb = 1e-9;  // every allreduce on a bucket actor
  return opts;
}

}  // namespace

TEST_CASE("the library's DDP fault points report the forward count as their step on every rank", "[ddp][fault]") {
  // Each rank checks every point it reaches against its loop's step; step 2 runs under no_sync
  // (its forward counts, its backward reduces nothing and reports no backward point).
  REQUIRE(test::run_group(2, [](int rank, const ddp::file_store& store, ddp::process_group&) {
    std::atomic<std::int64_t> loop{-1};
    std::atomic<int> points{0}, wrong{0};
    std::string first_wrong;
    std::mutex mu;
    ddp::process_group_options po;
    po.fault_points = [&](const std::string& point, std::int64_t step) {
      ++points;
      if (step == loop.load()) return;
      std::lock_guard<std::mutex> lock(mu);
      if (wrong++ == 0) first_wrong = point + " reported step " + std::to_string(step) + " in step " + std::to_string(loop.load());
    };
    ddp::process_group pg(store, rank, 2, "points", po);
    auto m = test::make_mlp(1);
    ddp::distributed_data_parallel d(m, pg, one_bucket_per_parameter());
    for (int step = 0; step < 6; ++step) {
      loop = step;
      auto [x, y] = test::batch(step, rank);
      if (step == 2) {
        auto guard = d.no_sync();
        backward(nn::mse_loss(d(x), y));
      } else {
        backward(nn::mse_loss(d(x), y));
      }
    }
    test::expect(wrong == 0, "rank " + std::to_string(rank) + ": " + first_wrong);
    // forward every step; backward, allreduce per bucket and allreduce_done per bucket in 5 steps.
    const int buckets = static_cast<int>(d.bucket_assignment().size());
    test::expect(points == 6 + 5 * (1 + 2 * buckets), "rank " + std::to_string(rank) + " reached " +
                                                          std::to_string(points.load()) + " points");
    test::expect(d.step() == 6, "step() is the forward count, got " + std::to_string(d.step()));
  }));
}

TEST_CASE("a plan's kill at allreduce step=3 kills the rank in the allreduce of its fourth forward", "[ddp][fault]") {
  shared_block shared;
  shared_counters* counters = shared.operator->();
  test::temp_store dir;
  const ddp::file_store store = dir.store;
  auto ctx = spawn(2, [store, counters](int rank) {
    const std::string worker = "rank" + std::to_string(rank);
    troupe::fault_injector injector(troupe::fault_plan::parse("kill allreduce step=3 worker=rank1\n"));
    ddp::process_group_options po;
    po.fault_points = [&](const std::string& point, std::int64_t step) {
      if (point == "allreduce") counters->allreduce_at[rank] = step;
      injector.on_point(worker, point, step);
    };
    ddp::process_group pg(store, rank, 2, "kill", po);
    auto m = test::make_mlp(1);
    ddp::distributed_data_parallel d(m, pg, one_bucket_per_parameter());
    for (int step = 0; step < 6; ++step) {
      counters->loop_step[rank] = step;
      auto [x, y] = test::batch(step, rank);
      backward(nn::mse_loss(d(x), y));
    }
  });
  std::string failure;
  try {
    ctx.join(60s);
  } catch (const error& e) {
    failure = e.message();
  }
  INFO("join: " << failure);
  CHECK(failure.find("rank 1") != std::string::npos);
  CHECK(counters->loop_step[1].load() == 3);
  CHECK(counters->allreduce_at[1].load() == 3);
  CHECK(counters->loop_step[0].load() <= 3);
}

TEST_CASE("set_step refuses a negative step and moves the count of the next forward", "[ddp][fault]") {
  REQUIRE(test::run_group(2, [](int rank, const ddp::file_store& store, ddp::process_group&) {
    std::atomic<std::int64_t> forward_step{-1};
    ddp::process_group_options po;
    po.fault_points = [&](const std::string& point, std::int64_t step) {
      if (point == "forward") forward_step = step;
    };
    ddp::process_group pg(store, rank, 2, "set_step", po);
    auto m = test::make_mlp(1);
    ddp::distributed_data_parallel d(m, pg);
    bool refused = false;
    try {
      d.set_step(-1);
    } catch (const error& e) {
      refused = e.code() == errc::bad_argument && e.message().find("-1") != std::string::npos;
    }
    test::expect(refused, "set_step(-1) is bad_argument naming the step");
    d.set_step(40);
    auto [x, y] = test::batch(0, rank);
    backward(nn::mse_loss(d(x), y));
    test::expect(forward_step == 40, "the forward after set_step(40) is step 40, got " + std::to_string(forward_step.load()));
    test::expect(d.step() == 41, "step() after it is 41");
  }));
}
