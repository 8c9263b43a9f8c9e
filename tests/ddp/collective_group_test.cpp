// The collective_group interface: the CPU groups through it, its guarantees (fingerprints,
// monitored barrier, work handles), and DDP over the NCCL group on a device ([cuda][nccl]).
#include <catch2/catch.hpp>

#include <chrono>

#include "ddp/ddp_harness.hpp"
#include "ddp/ddp_test_util.hpp"
#include "troupe/autograd/nn/loss.hpp"
#include "troupe/ddp/collective_group.hpp"
#include "troupe/ddp/nccl_process_group.hpp"
#include "troupe/tensors/cuda.hpp"
#include "troupe/tensors/factories.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using ddp::reduce_op;

namespace {

double at(const tensor& t, std::int64_t i) { return t.cpu().to(dtype::float64).contiguous().data<double>()[i]; }

/// Runs every collective of the interface once on `g` and checks the results; knows nothing of
/// the group's kind.
void exercise(ddp::collective_group& g) {
  const int w = g.world_size();
  const auto on = tensor_options{dtype::float32, g.device()};
  tensor a = full({8}, static_cast<double>(g.rank() + 1), on);
  g.allreduce(a, reduce_op::sum).wait(20s);
  test::expect(at(a, 7) == w * (w + 1) / 2.0, "allreduce(sum) gives the sum of 1..world");
  tensor b = full({4}, static_cast<double>(g.rank()), on);
  g.broadcast(b, w - 1).wait(20s);
  test::expect(at(b, 0) == w - 1, "broadcast from the last rank");
  tensor all = zeros({2 * w}, on);
  g.allgather(all, full({2}, static_cast<double>(g.rank()), on)).wait(20s);
  for (int r = 0; r < w; ++r) test::expect(at(all, 2 * r + 1) == r, "allgather puts rank r's block at r");
  tensor part = zeros({3}, on);
  g.reduce_scatter(part, ones({3 * w}, on), reduce_op::sum).wait(20s);
  test::expect(at(part, 2) == w, "reduce_scatter sums every rank's block");
  ddp::work bw = g.barrier();
  bw.wait(20s);
  test::expect(bw.is_completed() && !bw.error() && bw.completed_at().has_value(), "a finished barrier says so");
  g.monitored_barrier(20s);
  tensor buf = g.make_buffer({5}, dtype::float64);
  test::expect(buf.device() == g.device() && buf.numel() == 5 && at(buf, 4) == 0, "make_buffer is zero-filled on the group's device");
}

bool no_nccl_device() {
  if (ddp::nccl_compiled() && cuda::device_count() > 0) return false;
  WARN("no CUDA device or no NCCL in this build: skipped");
  return true;
}

}  // namespace

TEST_CASE("the shared-memory and TCP groups run the same code through the collective_group interface", "[ddp][process_group]") {
  const auto transport = GENERATE(ddp::transport_kind::shared_memory, ddp::transport_kind::tcp);
  INFO("transport " << static_cast<int>(transport));
  ddp::process_group_options opts;
  opts.transport = transport;
  REQUIRE(test::run_group(3, [](int, const ddp::file_store&, ddp::process_group& pg) {
    ddp::collective_group& g = pg;
    test::expect(g.device() == cpu_device, "a CPU group's device is cpu");
    exercise(g);
  }, opts));
}

TEST_CASE("a collective that differs on one rank, issued through the interface, fails with collective_mismatch on every rank",
          "[ddp][process_group]") {
  REQUIRE(test::run_group(3, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    ddp::collective_group& g = pg;
    try {
      g.allreduce(ones({rank == 1 ? 6 : 3})).wait(20s);
      test::expect(false, "rank " + std::to_string(rank) + ": a mismatched allreduce succeeded");
    } catch (const error& e) {
      test::expect(e.code() == errc::collective_mismatch, "collective_mismatch, got " + std::string(e.what()));
    }
    tensor t = ones({3});
    g.allreduce(t).wait(20s);  // the group stays usable
    test::expect(at(t, 0) == 3, "the next allreduce sums 3 ranks");
  }));
}

TEST_CASE("a work waited past its deadline throws timeout naming the collective", "[ddp][process_group]") {
  REQUIRE(test::run_group(2, [](int rank, const ddp::file_store& st, ddp::process_group& pg) {
    ddp::collective_group& g = pg;
    if (rank == 0) {
      ddp::work w = g.allreduce(ones({4}));
      try {
        w.wait(1ms);  // rank 1 joins only after this rank's deadline passed
        test::expect(false, "an allreduce completed without rank 1");
      } catch (const error& e) {
        test::expect(e.code() == errc::timeout, "timeout, got " + std::string(e.what()));
        test::expect(e.message().find("allreduce") != std::string::npos, "names the collective: " + e.message());
      }
      st.set("waited", "1");
      w.wait(20s);
    } else {
      st.get("waited", 20s);
      g.allreduce(ones({4})).wait(20s);
    }
  }));
}

TEST_CASE("DDP over the NCCL group on one device matches single-process training within 1e-5", "[ddp][nccl][cuda]") {
  if (no_nccl_device()) return;
  const bool as_view = GENERATE(false, true);
  INFO("gradient_as_bucket_view " << as_view);
  const device dev = cuda_device(0);
  test::temp_store st;
  ddp::nccl_process_group pg(st.store, 0, 1, "ddp-cuda", dev);
  exercise(pg);
  auto ref = test::make_mlp(7), model = test::make_mlp(7);
  ref->to(dev);
  model->to(dev);
  ddp::ddp_options o;
  o.gradient_as_bucket_view = as_view;
  o.bucket_cap_mb = 0.0001;  // several buckets
  ddp::distributed_data_parallel d(model, pg, o);
  optim::sgd ref_opt(ref->parameters(), {0.1}), opt(model->parameters(), {0.1});
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = test::batch(step, 0);
    x = x.to(dev);
    y = y.to(dev);
    ref_opt.zero_grad();
    backward(nn::mse_loss(ref->forward(x), y));
    ref_opt.step();
    opt.zero_grad();
    backward(nn::mse_loss(d(x), y));
    opt.step();
  }
  CHECK(test::max_rel_diff(test::flat_params(*model).cpu(), test::flat_params(*ref).cpu()) <= 1e-5);
}

TEST_CASE("the fp16 and bf16 compression hooks run on the device over NCCL", "[ddp][nccl][cuda]") {
  if (no_nccl_device()) return;
  const device dev = cuda_device(0);
  test::temp_store st;
  ddp::nccl_process_group pg(st.store, 0, 1, "hooks-cuda", dev);
  for (auto hook : {ddp::fp16_compress_hook(), ddp::bf16_compress_hook()}) {
    auto model = test::make_mlp(3);
    model->to(dev);
    ddp::distributed_data_parallel d(model, pg);
    d.register_comm_hook(hook);
    auto [x, y] = test::batch(0, 0);
    backward(nn::mse_loss(d(x.to(dev)), y.to(dev)));
    for (const auto& p : model->parameters()) {
      const tensor g = grad(p);
      REQUIRE(g.defined());
      CHECK(g.device() == dev);
    }
  }
}
