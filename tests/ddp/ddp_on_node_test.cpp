// DDP whose bucket actors run on the runtime node's actor system (ddp_options::node).
#include <catch2/catch.hpp>
#include <cstdlib>

#include "ddp/ddp_harness.hpp"
#include "ddp/ddp_test_util.hpp"
#include "troupe/ddp/env_process_group.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using test::expect;

namespace {

/// In a spawned child: the variables a launcher sets.
void set_launcher_env(int rank, int world, std::uint16_t port) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("TROUPE_JOB_TOKEN", "ddp-node-token", 1);
}

/// 10 SGD steps of DDP with its bucket actors on `n`; compares with one process on the
/// concatenated batches and checks the launch order of every step.
void train_on_node(int rank, node& n, ddp::process_group& pg) {
  auto model = test::make_mlp(static_cast<std::uint64_t>(rank + 1));  // rank 0's init must win
  ddp::ddp_options opts;
  opts.bucket_cap_mb = 0.0005;  // several buckets
  opts.first_bucket_cap_mb = 0.0001;
  opts.node = &n;
  ddp::distributed_data_parallel ddp(model, pg, opts);
  optim::sgd opt(ddp.parameters(), {.lr = 0.05});
  auto ref = test::make_mlp(1);
  optim::sgd ref_opt(ref->parameters(), {.lr = 0.05});
  for (int step = 0; step < 10; ++step) {
    auto [x, y] = test::batch(step, rank);
    opt.zero_grad();
    backward(nn::mse_loss(ddp(x), y));
    opt.step();
    const auto order = ddp.last_launch_order();
    expect(order.size() == ddp.bucket_assignment().size() && order.size() > 1, "every bucket launched");
    for (std::size_t b = 0; b < order.size(); ++b) expect(order[b] == static_cast<int>(b), "bucket-index launch order");
    tensor_list xs, ys;
    for (int r = 0; r < pg.world_size(); ++r) {
      auto [xr, yr] = test::batch(step, r);
      xs.push_back(xr);
      ys.push_back(yr);
    }
    ref_opt.zero_grad();
    backward(nn::mse_loss(ref->forward(cat(xs, 0)), cat(ys, 0)));
    ref_opt.step();
  }
  const double diff = test::max_rel_diff(test::flat_params(*model), test::flat_params(*ref));
  expect(diff <= 1e-6, "DDP on the node matches single-process training, max rel diff " + std::to_string(diff));
  expect(test::same_on_all_ranks(pg, test::flat_params(*model)), "parameters bitwise identical on all ranks");
}

}  // namespace

TEST_CASE("DDP with its bucket actors on the node's actor system trains like one process, and the node then shuts down",
          "[ddp]") {
  const std::uint16_t port = troupe::test::free_port();
  auto ctx = spawn(2, [port](int rank) {
    set_launcher_env(rank, 2, port);
    ddp::env_process_group dist("ddpnode");
    train_on_node(rank, dist.node(), dist.group());
    dist.shutdown(20s);  // hangs if a bucket actor outlived its wrapper (the test's join fails)
  });
  REQUIRE(ctx.join(90s));
}

TEST_CASE("shutting the node down before its DDP wrapper stops the bucket actors, and the wrapper then refuses a step",
          "[ddp]") {
  const std::uint16_t port = troupe::test::free_port();
  auto ctx = spawn(2, [port](int rank) {
    set_launcher_env(rank, 2, port);
    auto model = test::make_mlp(1);
    ddp::env_process_group dist("ddpnodeshut");
    ddp::ddp_options opts;
    opts.node = &dist.node();
    opts.timeout = 20s;
    ddp::distributed_data_parallel ddp(model, dist.group(), opts);
    for (int step = 0; step < 3; ++step) {  // the third step runs on the rebuilt buckets
      auto [x, y] = test::batch(step, rank);
      backward(nn::mse_loss(ddp(x), y));
    }
    dist.shutdown(20s);  // the wrapper is still alive: its bucket actors stop first
    auto [x, y] = test::batch(3, rank);
    try {
      static_cast<void>(ddp(x));
      expect(false, "a forward after the node's shutdown throws");
    } catch (const error& e) {
      expect(e.code() == errc::invalid_state, std::string("invalid_state, got: ") + e.what());
      expect(std::string(e.what()).find("shut down") != std::string::npos, std::string("names the shutdown: ") + e.what());
    }
  });  // the wrapper is destroyed after the node
  REQUIRE(ctx.join(90s));
}
