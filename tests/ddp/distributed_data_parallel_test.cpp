// DistributedDataParallel against single-process training, and the reducer's protocol.
#include <signal.h>
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <cstring>

#include "ddp/ddp_test_util.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using test::expect;

namespace {

/// Trains 20 SGD steps with DDP; each rank compares with one process on the concatenated batches.
void train_and_compare(int rank, ddp::process_group& pg, bool as_view, bool shared) {
  const int w = pg.world_size();
  auto model = test::make_mlp(static_cast<std::uint64_t>(rank + 1));  // rank 0's init must win
  ddp::ddp_options opts;
  opts.gradient_as_bucket_view = as_view;
  opts.shared_buckets = shared;
  opts.bucket_cap_mb = 0.0005;  // several buckets
  opts.first_bucket_cap_mb = 0.0001;
  ddp::distributed_data_parallel ddp(model, pg, opts);
  optim::sgd opt(ddp.parameters(), {.lr = 0.05});
  auto ref = test::make_mlp(1);
  optim::sgd ref_opt(ref->parameters(), {.lr = 0.05});
  for (int step = 0; step < 20; ++step) {
    auto [x, y] = test::batch(step, rank);
    opt.zero_grad();
    backward(nn::mse_loss(ddp(x), y));
    opt.step();
    tensor_list xs, ys;
    for (int r = 0; r < w; ++r) {
      auto [xr, yr] = test::batch(step, r);
      xs.push_back(xr);
      ys.push_back(yr);
    }
    ref_opt.zero_grad();
    backward(nn::mse_loss(ref->forward(cat(xs, 0)), cat(ys, 0)));
    ref_opt.step();
  }
  const double diff = test::max_rel_diff(test::flat_params(*model), test::flat_params(*ref));
  expect(diff <= 1e-6, "DDP matches single-process training, max rel diff " + std::to_string(diff));
  expect(test::same_on_all_ranks(pg, test::flat_params(*model)), "parameters bitwise identical on all ranks");
  if (as_view)  // the gradients are the bucket buffers: in the arena exactly when shared_buckets
    for (const auto& p : model->parameters()) expect(pg.is_shared(grad(p)) == shared, "gradient in the shared arena");
}

/// Two linears, `a` registered first but applied last: its gradients are ready first.
struct crossed : nn::unary_module {
  std::shared_ptr<nn::linear> a, b;
  explicit crossed(generator& g) {
    a = register_module("a", std::make_shared<nn::linear>(4, 4, g, true, test::f64));
    b = register_module("b", std::make_shared<nn::linear>(4, 4, g, true, test::f64));
  }
  tensor forward(const tensor& x) override { return a->forward(b->forward(x)); }
};

/// `main` always; `side` only when `use_side`.
struct branchy : nn::unary_module {
  std::shared_ptr<nn::linear> main, side;
  bool use_side = false;
  explicit branchy(generator& g) {
    main = register_module("main", std::make_shared<nn::linear>(6, 4, g, true, test::f64));
    side = register_module("side", std::make_shared<nn::linear>(6, 4, g, true, test::f64));
  }
  tensor forward(const tensor& x) override { return use_side ? main->forward(x) + side->forward(x) : main->forward(x); }
};

/// `main` always, `side` when `use_side`, `never` never (fixed initialisation).
struct partly_used : nn::unary_module {
  std::shared_ptr<nn::linear> main, side, never;
  bool use_side = false;
  partly_used() {
    generator g(7);
    main = register_module("main", std::make_shared<nn::linear>(6, 4, g, true, test::f64));
    side = register_module("side", std::make_shared<nn::linear>(6, 4, g, true, test::f64));
    never = register_module("never", std::make_shared<nn::linear>(6, 4, g, true, test::f64));
  }
  tensor forward(const tensor& x) override { return use_side ? main->forward(x) + side->forward(x) : main->forward(x); }
};

/// Gradients averaged by hand: local backward, then allreduce(avg) of the flat gradients.
tensor exact_average_grads(ddp::process_group& pg, nn::unary_module& m, const tensor& x, const tensor& y) {
  m.zero_grad();
  backward(nn::mse_loss(m.forward(x), y));
  tensor g = test::flat_grads(m);
  pg.allreduce(g, ddp::reduce_op::avg).wait(20s);
  return g;
}

}  // namespace

TEST_CASE("DDP training equals single-process training on the concatenated batches", "[ddp]") {
  const int world = GENERATE(2, 3);
  const bool as_view = GENERATE(false, true);
  const bool shared = GENERATE(true, false);  // bucket buffers in the shared arena (in-place allreduce) or not
  INFO("world " << world << ", gradient_as_bucket_view " << as_view << ", shared_buckets " << shared);
  REQUIRE(test::run_group(world, [as_view, shared](int rank, const ddp::file_store&, ddp::process_group& pg) {
    train_and_compare(rank, pg, as_view, shared);
  }));
}

TEST_CASE("buckets follow the reverse parameter order and the size caps", "[ddp]") {
  REQUIRE(test::run_group(1, [](int, const ddp::file_store&, ddp::process_group& pg) {
    generator g(3);
    auto m = std::make_shared<nn::sequential>();
    m->push_back(std::make_shared<nn::linear>(100, 100, g));  // weight 40000 B, bias 400 B
    m->push_back(std::make_shared<nn::linear>(100, 100, g));
    ddp::ddp_options opts;
    opts.first_bucket_cap_mb = 0.01;  // 10485 B: {1.bias, 1.weight}
    opts.bucket_cap_mb = 0.05;        // 52428 B: {0.bias, 0.weight}
    ddp::distributed_data_parallel d(m, pg, opts);
    const auto b = d.bucket_assignment();
    expect(b == std::vector<std::vector<std::size_t>>{{3, 2}, {1, 0}}, "buckets [[3, 2], [1, 0]]");
  }));
}

TEST_CASE("gradients ready out of order are reduced in bucket-index order, then buckets are rebuilt", "[ddp]") {
  REQUIRE(test::run_group(2, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    generator g(5);
    auto m = std::make_shared<crossed>(g);
    ddp::ddp_options opts;
    opts.bucket_cap_mb = opts.first_bucket_cap_mb = 1e-9;  // one parameter per bucket
    ddp::distributed_data_parallel d(m, pg, opts);
    // parameters: a.weight 0, a.bias 1, b.weight 2, b.bias 3; buckets: [3], [2], [1], [0]
    expect(d.bucket_assignment() == std::vector<std::vector<std::size_t>>{{3}, {2}, {1}, {0}}, "initial buckets");
    auto [x, y] = test::batch(0, rank);
    backward(nn::mse_loss(d(x.narrow(1, 0, 4)), y));
    const auto ready = d.last_ready_order();
    expect(ready.size() == 4 && ready[0] <= 1, "a's gradients are ready first");
    expect(d.last_launch_order() == std::vector<int>{0, 1, 2, 3}, "launched in bucket-index order");
    const auto tl = d.last_timeline();
    expect(tl.launched_ms.size() == 4 && tl.completed_ms.size() == 4, "a timeline entry per bucket");
    for (std::size_t b = 0; b < 4; ++b) {
      expect(tl.launched_ms[b] >= 0 && tl.launched_ms[b] <= tl.completed_ms[b], "launched before completed");
      expect(tl.completed_ms[b] <= tl.finished_ms && (b == 0 || tl.launched_ms[b - 1] <= tl.launched_ms[b]),
             "completed before the gradients were written back, launched in index order");
    }
    expect(tl.last_grad_ms <= tl.finished_ms, "the last gradient came before the end");
    tensor expected = exact_average_grads(pg, *m, x.narrow(1, 0, 4), y);
    m->zero_grad();
    backward(nn::mse_loss(d(x.narrow(1, 0, 4)), y));  // this forward rebuilt the buckets
    const auto rebuilt = d.bucket_assignment();
    expect(rebuilt.size() == 4 && rebuilt[0][0] == ready[0] && rebuilt[3][0] == ready[3], "rebuilt in ready order");
    expect(d.last_launch_order() == std::vector<int>{0, 1, 2, 3}, "still launched in index order");
    expect(test::max_rel_diff(test::flat_grads(*m), expected) <= 1e-12, "averaged gradients after the rebuild");
  }));
}

TEST_CASE("find_unused_parameters lets a backward that skips a branch finish", "[ddp]") {
  REQUIRE(test::run_group(2, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    generator g(7);
    auto m = std::make_shared<branchy>(g);
    ddp::ddp_options opts;
    opts.find_unused_parameters = true;
    opts.bucket_cap_mb = opts.first_bucket_cap_mb = 1e-9;
    ddp::distributed_data_parallel d(m, pg, opts);
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = test::batch(step, rank);
      m->zero_grad();
      backward(nn::mse_loss(d(x), y));
      // Unused on every rank: .grad untouched (never defined here), as PyTorch.
      expect(!grad(m->side->weight).defined() && !grad(m->side->bias).defined(), "the branch unused everywhere has no gradient");
      expect(test::same_on_all_ranks(pg, test::flat_grads(*m)), "gradients identical on all ranks");
    }
  }));
}

TEST_CASE("find_unused_parameters averages a parameter used on some ranks and leaves one unused on all untouched", "[ddp]") {
  const bool as_view = GENERATE(false, true);
  INFO("gradient_as_bucket_view " << as_view);
  REQUIRE(test::run_group(2, [as_view](int rank, const ddp::file_store&, ddp::process_group& pg) {
    auto m = std::make_shared<partly_used>();  // main: used everywhere; side: on rank 0 only; never: nowhere
    ddp::ddp_options opts;
    opts.find_unused_parameters = true;
    opts.gradient_as_bucket_view = as_view;
    opts.bucket_cap_mb = opts.first_bucket_cap_mb = 1e-9;
    ddp::distributed_data_parallel d(m, pg, opts);
    set_grad(m->never->bias, full({4}, 7.0 + rank, test::f64));  // a defined .grad that must survive
    m->use_side = rank == 0;
    for (int step = 0; step < 2; ++step) {
      auto [x, y] = test::batch(step, rank);
      m->main->zero_grad();
      m->side->zero_grad();
      backward(nn::mse_loss(d(x), y));
      expect(!grad(m->never->weight).defined(), "an undefined .grad of a parameter unused everywhere stays undefined");
      expect(grad(m->never->bias).data<double>()[3] == 7.0 + rank, "a defined one keeps its value (not averaged)");
      expect(grad(m->side->weight).defined() && grad(m->side->weight).abs().sum().item() > 0,
             "side has a gradient on every rank, also where it was unused");
      // The reference: the same model's local gradients (zero where unused), averaged by hand.
      auto ref = std::make_shared<partly_used>();
      ref->use_side = rank == 0;
      const tensor want = exact_average_grads(pg, *ref, x, y);
      const std::int64_t n = 2 * (6 * 4 + 4);  // main.*, side.* come first in parameters()
      expect(test::max_rel_diff(test::flat_grads(*m).narrow(0, 0, n), want.narrow(0, 0, n)) <= 1e-12,
             "main and side gradients are the averages (rank 1 contributes zero for side)");
    }
  }));
}

TEST_CASE("a parameter without gradient is reported at the next forward with what to do", "[ddp]") {
  REQUIRE(test::run_group(2, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    generator g(7);
    auto m = std::make_shared<branchy>(g);
    ddp::ddp_options opts;
    opts.bucket_cap_mb = opts.first_bucket_cap_mb = 1e-9;
    ddp::distributed_data_parallel d(m, pg, opts);
    auto [x, y] = test::batch(0, rank);
    backward(nn::mse_loss(d(x), y));  // side.* never get a gradient: backward returns, unreduced
    try {
      d(x);
      expect(false, "the next forward should fail");
    } catch (const error& e) {
      expect(e.code() == errc::autograd_error, "autograd_error, got " + std::string(e.what()));
      expect(e.message().find("'side.weight'") != std::string::npos, "names side.weight: " + e.message());
      expect(e.message().find("find_unused_parameters=true") != std::string::npos, "says what to do");
    }
    m->use_side = true;  // the wrapper recovers: the next iteration reduces everything
    m->zero_grad();
    backward(nn::mse_loss(d(x), y));
    expect(test::same_on_all_ranks(pg, test::flat_grads(*m)), "a full iteration works afterwards");
  }));
}

TEST_CASE("no_sync accumulates locally and the next synchronised backward reduces the sum", "[ddp]") {
  REQUIRE(test::run_group(2, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    auto m = test::make_mlp(1);
    ddp::distributed_data_parallel d(m, pg);
    auto [xa, ya] = test::batch(0, rank);
    auto [xb, yb] = test::batch(1, rank);
    {
      auto guard = d.no_sync();
      backward(nn::mse_loss(d(xa), ya));
    }
    const tensor local_a = test::flat_grads(*m);
    backward(nn::mse_loss(d(xb), yb));
    const tensor synced = test::flat_grads(*m);
    auto ref = test::make_mlp(1);
    backward(nn::mse_loss(ref->forward(xa), ya));
    expect(test::max_rel_diff(local_a, test::flat_grads(*ref)) <= 1e-12, "no_sync kept the local gradient");
    backward(nn::mse_loss(ref->forward(xb), yb));
    tensor sum = test::flat_grads(*ref);
    pg.allreduce(sum, ddp::reduce_op::avg).wait(20s);
    expect(test::max_rel_diff(synced, sum) <= 1e-12, "the synced backward averaged the accumulated sums");
  }));
}

TEST_CASE("fp16, bf16 and user communication hooks average within their tolerance", "[ddp]") {
  REQUIRE(test::run_group(2, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    struct variant { const char* name; ddp::comm_hook hook; double tol; };
    auto calls = std::make_shared<int>(0);
    ddp::comm_hook user = [calls](ddp::collective_group& g, ddp::grad_bucket& b) {
      ++*calls;
      ddp::comm_result r{g.allreduce(b.buffer, ddp::reduce_op::sum), nullptr};
      tensor buf = b.buffer;
      const double n = g.world_size();
      r.then = [buf, n]() mutable { buf.div_(n); };
      return r;
    };
    for (const auto& v : {variant{"fp16", ddp::fp16_compress_hook(), 2e-3}, variant{"bf16", ddp::bf16_compress_hook(), 1.6e-2},
                          variant{"user", user, 1e-12}}) {
      auto m = test::make_mlp(1);
      ddp::ddp_options opts;
      opts.bucket_cap_mb = 0.0005;
      ddp::distributed_data_parallel d(m, pg, opts);
      d.register_comm_hook(v.hook);
      auto [x, y] = test::batch(2, rank);
      backward(nn::mse_loss(d(x), y));
      const tensor got = test::flat_grads(*m);
      auto ref = test::make_mlp(1);
      const tensor want = exact_average_grads(pg, *ref, x, y);
      double scale = 0;
      for (std::int64_t i = 0; i < want.numel(); ++i) scale = std::max(scale, std::abs(want.data<double>()[i]));
      double worst = 0;
      for (std::int64_t i = 0; i < want.numel(); ++i)
        worst = std::max(worst, std::abs(got.data<double>()[i] - want.data<double>()[i]));
      expect(worst <= v.tol * std::max(scale, 1e-3), std::string(v.name) + " hook error " + std::to_string(worst));
      expect(test::same_on_all_ranks(pg, got), std::string(v.name) + ": identical gradients on all ranks");
      if (std::string(v.name) == "user")
        expect(*calls == static_cast<int>(d.bucket_assignment().size()), "user hook called once per bucket");
    }
  }));
}

TEST_CASE("models that differ across ranks are rejected at construction on every rank", "[ddp]") {
  REQUIRE(test::run_group(2, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    generator g(1);
    auto m = std::make_shared<nn::linear>(6, rank == 1 ? 5 : 4, g);
    try {
      ddp::distributed_data_parallel d(m, pg);
      expect(false, "construction should fail");
    } catch (const error& e) {
      expect(e.code() == errc::shape_mismatch, "shape_mismatch, got " + std::string(e.what()));
      const std::string msg = e.message();
      expect(msg.find("rank 1 has 'weight float32[5, 6]'") != std::string::npos &&
                 msg.find("rank 0 has 'weight float32[4, 6]'") != std::string::npos, "names both: " + msg);
    }
  }));
}

TEST_CASE("a rank killed mid-backward makes the others' backward fail with peer_lost within 2 s", "[ddp][fault]") {
  auto probe = std::make_shared<test::peer_loss_probe>();
  test::temp_store dir;
  auto ctx = test::spawn_group(dir, 3, [probe](int rank, const ddp::file_store&, ddp::process_group& pg) {
    auto m = test::make_mlp(1);
    ddp::ddp_options opts;
    opts.bucket_cap_mb = opts.first_bucket_cap_mb = 1e-9;
    ddp::distributed_data_parallel d(m, pg, opts);
    // Named references, not a structured binding: clang 14 cannot capture one in a lambda.
    auto data = test::batch(0, rank);
    auto& x = data.first;
    auto& y = data.second;
    backward(nn::mse_loss(d(x), y));  // one healthy iteration
    if (rank == 2) {
      // Dies when the first layer's gradient arrives: later buckets were already launched.
      register_hook(m->parameters()[0], [probe](const tensor&) -> tensor { probe->kill_self(); });
    }
    probe->report(rank, [&] { backward(nn::mse_loss(d(x), y)); });
  });
  test::check_peer_lost(*probe, 2, 2, "DDP backward");
  REQUIRE_THROWS_AS(ctx.join(20s), error);
}
