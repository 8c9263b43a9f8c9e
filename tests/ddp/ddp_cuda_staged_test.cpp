// DDP with CUDA parameters over the CPU groups (Note [Host-staged collectives]): 2 ranks on one
// device against single-process training on that device. The [gpu_fork] tests fork ranks that
// use the device, so their parent never touches CUDA. A process that initialised CUDA cannot
// fork children that use it. So the device is probed in a child, and the references are
// computed in the ranks. Run them in a process of their own ("[gpu_fork]"), not after other
// [cuda] tests.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <set>

#include "ddp/ddp_test_util.hpp"
#include "troupe/ddp/host_staged_group.hpp"
#include "troupe/ddp/nccl_process_group.hpp"
#include "troupe/tensors/cuda.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using test::expect;

namespace {

/// The number of CUDA devices, as a forked child sees it (the parent stays CUDA-free).
int devices_seen_by_a_child() {
  test::result_pipe<int> pipe;
  auto ctx = spawn(1, [&pipe](int) { pipe.write(cuda::device_count()); });
  const int n = pipe.read(60s);
  ctx.join(60s);
  return n;
}

bool no_device_for_children() {
  if (devices_seen_by_a_child() > 0) return false;
  WARN("no CUDA device visible to a child process: skipped");
  return true;
}

/// NCCL refuses two ranks on one device: world size 2 needs two devices.
bool fewer_than_two_devices() {
  if (ddp::nccl_compiled() && devices_seen_by_a_child() >= 2) return false;
  WARN("fewer than 2 CUDA devices visible to a child process, or no NCCL in this build: skipped");
  return true;
}

struct run_options {
  bool as_view = false;
  int hook = 0;         // 0: allreduce, 1: fp16, 2: bf16
  double tol = 1e-5;    // against single-process training on the device
};

/// The gradients of bucket b are views of one buffer on the device (gradient_as_bucket_view).
void expect_bucket_views(const ddp::distributed_data_parallel& d, device dev) {
  const tensor_list ps = d.parameters();
  std::set<const void*> bases;
  for (const auto& bucket : d.bucket_assignment()) {
    const void* base = nullptr;
    for (std::size_t i : bucket) {
      const tensor g = grad(ps[i]);
      expect(g.defined() && g.device() == dev, "the gradient is on the device");
      expect(g.is_view(), "the gradient is a view of its bucket");
      const void* b = g.base().data_ptr();
      expect(base == nullptr || base == b, "the gradients of one bucket view one buffer");
      base = b;
    }
    bases.insert(base);
  }
  expect(bases.size() == d.bucket_assignment().size(), "every bucket has a buffer of its own");
}

/// 4 SGD steps of the MLP on `dev` with DDP over `pg`, against one process on the device.
/// True when `t` (on the group's device) is bitwise equal on every rank of `g`.
bool same_everywhere(ddp::collective_group& g, const tensor& t) {
  const tensor mine = t.contiguous().to(g.device());
  tensor all = zeros({mine.numel() * g.world_size()}, {mine.dtype(), g.device()});
  g.allgather(all, mine).wait(20s);
  const tensor host = all.cpu();
  const auto bytes = mine.nbytes();
  const auto* base = static_cast<const char*>(host.data_ptr());
  for (int r = 1; r < g.world_size(); ++r)
    if (std::memcmp(base, base + r * bytes, bytes) != 0) return false;
  return true;
}

void train_on_device(int rank, ddp::collective_group& pg, device dev, const run_options& ro) {
  const int w = pg.world_size();
  auto model = test::make_mlp(static_cast<std::uint64_t>(rank + 1));  // rank 0's init must win
  model->to(dev);
  ddp::ddp_options o;
  o.gradient_as_bucket_view = ro.as_view;
  o.bucket_cap_mb = 0.0005;  // several buckets
  o.first_bucket_cap_mb = 0.0001;
  o.timeout = 30s;
  ddp::distributed_data_parallel d(model, pg, o);
  if (ro.hook == 1) d.register_comm_hook(ddp::fp16_compress_hook());
  if (ro.hook == 2) d.register_comm_hook(ddp::bf16_compress_hook());
  auto ref = test::make_mlp(1);
  ref->to(dev);
  optim::sgd opt(d.parameters(), {.lr = 0.05}), ref_opt(ref->parameters(), {.lr = 0.05});
  for (int step = 0; step < 4; ++step) {
    auto [x, y] = test::batch(step, rank);
    opt.zero_grad();
    backward(nn::mse_loss(d(x.to(dev)), y.to(dev)));
    opt.step();
    tensor_list xs, ys;
    for (int r = 0; r < w; ++r) {
      auto [xr, yr] = test::batch(step, r);
      xs.push_back(xr.to(dev));
      ys.push_back(yr.to(dev));
    }
    ref_opt.zero_grad();
    backward(nn::mse_loss(ref->forward(cat(xs, 0)), cat(ys, 0)));
    ref_opt.step();
  }
  if (ro.as_view) expect_bucket_views(d, dev);
  const tensor mine = test::flat_params(*model).cpu();
  const double diff = test::max_rel_diff(mine, test::flat_params(*ref).cpu());
  expect(diff <= ro.tol, "DDP on the device matches single-process training, max rel diff " + std::to_string(diff));
  expect(same_everywhere(pg, mine), "parameters bitwise identical on both ranks");
}

ddp::process_group_options over(ddp::transport_kind t) {
  ddp::process_group_options o;
  o.transport = t;
  o.timeout = 30s;
  return o;
}

#if defined(TROUPE_WITH_CUDA)  // streams exist only in CUDA builds
/// Linear(512, 512) -> Tanh -> Linear(512, 512), float64.
std::shared_ptr<nn::sequential> make_wide(std::uint64_t seed) {
  generator g(seed);
  auto m = std::make_shared<nn::sequential>();
  m->push_back(std::make_shared<nn::linear>(512, 512, g, true, test::f64));
  m->push_back(std::make_shared<nn::tanh>());
  m->push_back(std::make_shared<nn::linear>(512, 512, g, true, test::f64));
  return m;
}

/// DDP steps whose forward and backward run on a side stream, against one process on the
/// device. The stream is non-blocking, so the legacy default stream of the bucket actor's
/// thread is not ordered after it implicitly. Only the gradient events order the bucket's copy
/// to the host.
void train_on_side_stream(int rank, ddp::process_group& pg) {
  const device dev = cuda_device(0);
  cuda::stream side(0);  // outlives every tensor used on it
  auto model = make_wide(static_cast<std::uint64_t>(rank + 3)), ref = make_wide(3);
  model->to(dev);
  ref->to(dev);
  ddp::ddp_options o;
  o.bucket_cap_mb = 1.0;  // one bucket per weight
  o.first_bucket_cap_mb = 1.0;
  o.timeout = 30s;
  ddp::distributed_data_parallel d(model, pg, o);
  optim::sgd opt(d.parameters(), {.lr = 0.01}), ref_opt(ref->parameters(), {.lr = 0.01});
  // The last weight's gradient is made final only after tens of ms of kernels that a gradient
  // hook queues on the side stream.
  const tensor big = full({8192, 8192}, 1e-4, {dtype::float64, dev});
  auto slow = register_hook(model->parameters()[2], [big](const tensor& g) {
    return g + sum(matmul(matmul(big, big), big)) * 0.0;
  });
  for (int step = 0; step < 3; ++step) {
    generator g(static_cast<std::uint64_t>(50 + step));
    const tensor x0 = randn({2048, 512}, g, test::f64), x1 = randn({2048, 512}, g, test::f64);
    const tensor y = randn({2048, 512}, g, test::f64);
    cuda::stream_guard on_side(side);
    const tensor xd = (rank == 0 ? x0 : x1).to(dev), yd = y.to(dev);
    opt.zero_grad();
    backward(nn::mse_loss(d(xd), yd));
    opt.step();
    ref_opt.zero_grad();
    backward(nn::mse_loss(ref->forward(cat({x0.to(dev), x1.to(dev)}, 0)), cat({yd, yd}, 0)));
    ref_opt.step();
  }
  const tensor mine = test::flat_params(*model).cpu();
  const double diff = test::max_rel_diff(mine, test::flat_params(*ref).cpu());
  expect(diff <= 1e-5, "DDP on a side stream matches single-process training, max rel diff " + std::to_string(diff));
  expect(test::same_on_all_ranks(pg, mine), "parameters bitwise identical on both ranks");
}
#endif

}  // namespace

TEST_CASE("a host-staged group refuses a CPU device and tensors that are not on its device, before any copy",
          "[ddp][process_group]") {
  test::temp_store st;
  ddp::process_group pg(st.store, 0, 1, "staged");
  try {
    ddp::host_staged_group bad(pg, cpu_device);
    FAIL("a host-staged group on the cpu was constructed");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::device_mismatch);
    CHECK_THAT(e.message(), Catch::Contains("CUDA device"));
  }
  ddp::host_staged_group g(pg, cuda_device(0));
  CHECK(g.device() == cuda_device(0));
  CHECK(g.world_size() == 1);
  CHECK(g.name() == pg.name());
  try {
    g.allreduce(ones({4}));
    FAIL("a cpu tensor was reduced by a host-staged group on cuda:0");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::device_mismatch);
    CHECK_THAT(e.message(), Catch::Contains("allreduce"));
  }
  CHECK_THROWS_AS(g.make_buffer({-1}, dtype::float32), troupe::error);
}

TEST_CASE("DDP with CUDA parameters over the shared-memory and TCP groups matches single-process training on the device",
          "[ddp][cuda][gpu_fork]") {
  if (no_device_for_children()) return;
  const auto transport = GENERATE(ddp::transport_kind::shared_memory, ddp::transport_kind::tcp);
  const bool as_view = GENERATE(false, true);
  INFO("transport " << static_cast<int>(transport) << ", gradient_as_bucket_view " << as_view);
  run_options ro;
  ro.as_view = as_view;
  CHECK(test::run_group(2, [ro](int rank, const ddp::file_store&, ddp::process_group& pg) { train_on_device(rank, pg, cuda_device(0), ro); },
                        over(transport), 120s));
}

TEST_CASE("the fp16 and bf16 compression hooks run on CUDA parameters over a CPU group, ranks bitwise identical",
          "[ddp][cuda][gpu_fork]") {
  if (no_device_for_children()) return;
  const int hook = GENERATE(1, 2);
  INFO("hook " << (hook == 1 ? "fp16" : "bf16"));
  run_options ro;
  ro.hook = hook;
  ro.as_view = true;
  ro.tol = hook == 1 ? 1e-3 : 1e-2;  // the compression's rounding, not a stale gradient
  CHECK(test::run_group(2, [ro](int rank, const ddp::file_store&, ddp::process_group& pg) { train_on_device(rank, pg, cuda_device(0), ro); },
                        over(ddp::transport_kind::shared_memory), 120s));
}

#if defined(TROUPE_WITH_CUDA)
TEST_CASE("a bucket's host-staged reduction waits for gradients produced on a non-blocking side stream",
          "[ddp][cuda][gpu_fork]") {
  if (no_device_for_children()) return;
  CHECK(test::run_group(2, [](int rank, const ddp::file_store&, ddp::process_group& pg) { train_on_side_stream(rank, pg); },
                        over(ddp::transport_kind::shared_memory), 120s));
}
#endif

TEST_CASE("DDP over the NCCL group at world size 2 matches single-process training, ranks bitwise identical",
          "[ddp][nccl][gpu_fork][multigpu]") {
  if (fewer_than_two_devices()) return;
  const bool as_view = GENERATE(false, true);
  INFO("gradient_as_bucket_view " << as_view);
  test::temp_store dir;
  const ddp::file_store store = dir.store;
  auto ctx = spawn(2, [store, as_view](int rank) {
    ddp::nccl_process_group pg(store, rank, 2, "ddp-nccl2", cuda_device(rank), over(ddp::transport_kind::tcp));
    run_options ro;
    ro.as_view = as_view;
    train_on_device(rank, pg, cuda_device(rank), ro);
  });
  CHECK(ctx.join(120s));
}

TEST_CASE("a rank that dies fails the other rank's NCCL collective through the watchdog, never a hang",
          "[ddp][nccl][gpu_fork][multigpu]") {
  if (fewer_than_two_devices()) return;
  test::temp_store dir;
  const ddp::file_store store = dir.store;
  test::peer_loss_probe probe;
  auto ctx = spawn(2, [store, &probe](int rank) {
    ddp::process_group_options o;
    o.timeout = 5s;
    ddp::nccl_process_group pg(store, rank, 2, "nccl-loss", cuda_device(rank), o);
    tensor t = ones({1 << 16}, {dtype::float32, cuda_device(rank)});
    pg.allreduce(t).wait(30s);  // the communicator works on both ranks
    if (rank == 1) probe.kill_self();
    probe.report(rank, [&] {
      for (int i = 0; i < 100; ++i) pg.allreduce(t).wait(30s);
    });
  });
  const test::loss_report r = probe.read(90s);
  CHECK(r.rank == 0);
  INFO(r.text);
  CHECK((r.code == static_cast<int>(errc::nccl_failure) || r.code == static_cast<int>(errc::timeout)));
  CHECK(r.ms < 20000);  // opts.timeout (5 s) and the watchdog's period, with room for a loaded host
  CHECK_THROWS_AS(ctx.join(60s), troupe::error);  // rank 1 died by SIGKILL
}
