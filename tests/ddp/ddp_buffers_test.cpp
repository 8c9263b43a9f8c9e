// DistributedDataParallel's buffers: broadcast from rank 0 at construction, and before every
// forward when broadcast_buffers is on (PyTorch's default); left alone when it is off.
#include <catch2/catch.hpp>

#include "ddp/ddp_test_util.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using test::expect;

namespace {

/// A linear layer and a running counter buffer that every forward bumps by `step_by` (like
/// batch norm's running statistics, updated outside autograd). `seen` records the counter's
/// value at the entry of each forward.
struct counting : nn::unary_module {
  std::shared_ptr<nn::linear> lin;
  tensor counter;
  double step_by;
  std::vector<double> seen;

  counting(double start, double by) : step_by(by) {
    generator g(5);
    lin = register_module("lin", std::make_shared<nn::linear>(6, 4, g, true, test::f64));
    counter = full({1}, start, test::f64);
    register_buffer("counter", counter);
  }
  tensor forward(const tensor& x) override {
    seen.push_back(counter.data<double>()[0]);
    counter.data<double>()[0] += step_by;
    return lin->forward(x);
  }
};

/// Runs four DDP steps on a `counting` module whose start and increment depend on the rank.
std::vector<double> counters_seen(int rank, ddp::process_group& pg, bool broadcast) {
  auto m = std::make_shared<counting>(10.0 * (rank + 1), rank + 1.0);
  ddp::ddp_options opts;
  opts.broadcast_buffers = broadcast;
  ddp::distributed_data_parallel ddp(m, pg, opts);
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = test::batch(step, rank);
    backward(nn::mse_loss(ddp(x), y));
  }
  return m->seen;
}

}  // namespace

TEST_CASE("DDP broadcasts buffers from rank 0 before every forward when broadcast_buffers is on", "[ddp]") {
  REQUIRE(test::run_group(3, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    const auto seen = counters_seen(rank, pg, true);
    expect(seen.size() == 4, "four forwards ran");
    for (std::size_t k = 0; k < seen.size(); ++k)  // rank 0 started at 10 and adds 1 per forward
      expect(seen[k] == 10.0 + static_cast<double>(k),
             "rank " + std::to_string(rank) + " forward " + std::to_string(k) + " saw rank 0's counter, got " + std::to_string(seen[k]));
  }));
}

TEST_CASE("DDP keeps each rank's buffers after construction when broadcast_buffers is off", "[ddp]") {
  REQUIRE(test::run_group(2, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    const auto seen = counters_seen(rank, pg, false);
    expect(seen.size() == 4, "four forwards ran");
    for (std::size_t k = 0; k < seen.size(); ++k)  // rank 0's start (construction), then its own increments
      expect(seen[k] == 10.0 + static_cast<double>(k) * (rank + 1),
             "rank " + std::to_string(rank) + " forward " + std::to_string(k) + " kept its own counter, got " + std::to_string(seen[k]));
  }));
}
