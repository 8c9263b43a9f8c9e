// DistributedDataParallel over a module with several inputs, against single-process training.
#include <catch2/catch.hpp>

#include "ddp/ddp_test_util.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using test::expect;

namespace {

/// Two towers: relu(a(x)) + b(z), x [n, 6] and z [n, 3] -> [n, 4].
struct two_towers : nn::multi_input_module {
  std::shared_ptr<nn::linear> a, b;
  explicit two_towers(std::uint64_t seed) {
    generator g(seed);
    a = register_module("a", std::make_shared<nn::linear>(6, 4, g, true, test::f64));
    b = register_module("b", std::make_shared<nn::linear>(3, 4, g, true, test::f64));
  }
  tensor forward(const tensor_list& in) override {
    if (in.size() != 2) throw error(errc::bad_argument, "two_towers takes 2 inputs, got " + std::to_string(in.size()));
    return a->forward(in[0]).relu() + b->forward(in[1]);
  }
};

/// The batch of `rank` at `step`: x [4, 6], z [4, 3], y [4, 4].
std::tuple<tensor, tensor, tensor> batch3(int step, int rank) {
  generator g(static_cast<std::uint64_t>(5000 + step * 64 + rank));
  return {randn({4, 6}, g, test::f64), randn({4, 3}, g, test::f64), randn({4, 4}, g, test::f64)};
}

}  // namespace

TEST_CASE("DDP over a module with two inputs equals single-process training on the concatenated batches", "[ddp]") {
  const int world = GENERATE(2, 3);
  INFO("world " << world);
  REQUIRE(test::run_group(world, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    const int w = pg.world_size();
    auto model = std::make_shared<two_towers>(static_cast<std::uint64_t>(rank + 1));  // rank 0's init must win
    ddp::ddp_options opts;
    opts.bucket_cap_mb = 0.0002;  // several buckets
    opts.first_bucket_cap_mb = 0.0001;
    ddp::distributed_data_parallel ddp(model, pg, opts);
    optim::sgd opt(ddp.parameters(), {.lr = 0.05});
    two_towers ref(1);
    optim::sgd ref_opt(ref.parameters(), {.lr = 0.05});
    for (int step = 0; step < 20; ++step) {
      auto [x, z, y] = batch3(step, rank);
      opt.zero_grad();
      backward(nn::mse_loss(ddp({x, z}), y));
      opt.step();
      tensor_list xs, zs, ys;
      for (int r = 0; r < w; ++r) {
        auto [xr, zr, yr] = batch3(step, r);
        xs.push_back(xr);
        zs.push_back(zr);
        ys.push_back(yr);
      }
      ref_opt.zero_grad();
      backward(nn::mse_loss(ref.forward({cat(xs, 0), cat(zs, 0)}), cat(ys, 0)));
      ref_opt.step();
    }
    const double diff = test::max_rel_diff(test::flat_params(*model), test::flat_params(ref));
    expect(diff <= 1e-6, "DDP matches single-process training, max rel diff " + std::to_string(diff));
    expect(test::same_on_all_ranks(pg, test::flat_params(*model)), "parameters bitwise identical on all ranks");
    expect(&ddp.wrapped() == model.get(), "wrapped() is the module");
    bool refused = false;
    try {
      ddp.module();
    } catch (const error& e) {
      refused = e.code() == errc::invalid_state;
    }
    expect(refused, "module() of a multi-input wrapper is invalid_state");
  }));
}

TEST_CASE("a unary module wrapped in DDP rejects several inputs before any collective", "[ddp]") {
  REQUIRE(test::run_group(2, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    ddp::distributed_data_parallel ddp(test::make_mlp(1), pg);
    auto [x, y] = test::batch(0, rank);
    bool refused = false;
    try {
      ddp({x, x});
    } catch (const error& e) {
      refused = e.code() == errc::bad_argument && e.message().find("got 2") != std::string::npos;
    }
    expect(refused, "two inputs to a unary module: bad_argument naming the count");
    backward(nn::mse_loss(ddp(tensor_list{x}), y));  // one input in a list works, and the group is in step
    expect(test::same_on_all_ranks(pg, test::flat_grads(ddp.module())), "averaged gradients equal on all ranks");
  }));
}
