// DDP training step of an MLP 1024-1024-1024-10 (2.1 M parameters), batch 64 per rank, 2 ranks
// on this host, against the same step without DDP: in one process alone (the limit BENCH.md
// names) and in 2 concurrent processes without communication (the same CPU contention as the
// DDP run, so the ratio to it isolates the cost of communication). Correctness beside the
// timing: after the timed steps the parameters are bitwise identical on both ranks.
//
// Metrics: ddp_step_ms, limit_local_step_ms, ddp_overhead_ratio (ddp / local alone),
// local_step_2proc_ms, ddp_comm_overhead_ratio (ddp / local in 2 processes). --quick: few steps.
#include <poll.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include "bench_util.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/autograd/nn/activation.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/nn/loss.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/ddp/distributed_data_parallel.hpp"
#include "troupe/ddp/file_store.hpp"
#include "troupe/tensors/factories.hpp"

namespace tb = troupe::bench;
using namespace troupe;

namespace {

std::shared_ptr<nn::sequential> make_mlp(int rank) {
  generator g(static_cast<std::uint64_t>(11 + rank));
  auto m = std::make_shared<nn::sequential>();
  m->push_back(std::make_shared<nn::linear>(1024, 1024, g));
  m->push_back(std::make_shared<nn::relu>());
  m->push_back(std::make_shared<nn::linear>(1024, 1024, g));
  m->push_back(std::make_shared<nn::relu>());
  m->push_back(std::make_shared<nn::linear>(1024, 10, g));
  return m;
}

/// Median seconds of `iters` steps of `forward` + MSE + backward + SGD.
template <class Forward>
tb::stats time_steps(Forward forward, const tensor_list& params, int rank, int warmup, int iters) {
  optim::sgd opt(params, {.lr = 1e-3});
  generator g(static_cast<std::uint64_t>(77 + rank));
  const tensor x = randn({64, 1024}, g), y = randn({64, 10}, g);
  return tb::summarize(tb::time_runs(warmup, iters, [&] {
    opt.zero_grad();
    backward(nn::mse_loss(forward(x), y));
    opt.step();
  }));
}

struct result {
  double median_s = 0, p99_s = 0;
  int ok = 0;
};

/// Runs `body(rank, store)` on 2 spawned ranks; rank 0 returns its result through a pipe.
result run_two(const std::function<result(int, const ddp::file_store&)>& body) {
  int fds[2];
  if (::pipe(fds) != 0) throw error(errc::io_error, "ddp_bench: pipe");
  auto store = ddp::file_store::make_temp();
  result r;
  try {
    auto ctx = spawn(2, [&](int rank) {
      const result mine = body(rank, store);
      if (rank == 0 && ::write(fds[1], &mine, sizeof(mine)) != static_cast<ssize_t>(sizeof(mine)))
        throw error(errc::io_error, "ddp_bench: result write");
    });
    if (!ctx.join(std::chrono::minutes(5))) throw error(errc::timeout, "ddp_bench: ranks did not finish");
    pollfd p{fds[0], POLLIN, 0};
    if (::poll(&p, 1, 1000) != 1 || ::read(fds[0], &r, sizeof(r)) != static_cast<ssize_t>(sizeof(r)))
      throw error(errc::io_error, "ddp_bench: missing result");
  } catch (...) {
    store.remove_dir();
    ::close(fds[0]);
    ::close(fds[1]);
    throw;
  }
  store.remove_dir();
  ::close(fds[0]);
  ::close(fds[1]);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = tb::quick_mode(argc, argv);
  const int warmup = quick ? 2 : 5, iters = quick ? 5 : 40;
  const std::string params = "\"ranks\": 2, \"batch_per_rank\": 64, \"iters\": " + std::to_string(iters);
  tb::report rep("ddp");
  try {
    const result ddp_r = run_two([&](int rank, const ddp::file_store& store) {
      ddp::process_group pg(store, rank, 2, "ddp_bench");
      auto m = make_mlp(rank);
      ddp::distributed_data_parallel d(m, pg);
      const auto s = time_steps([&](const tensor& x) { return d(x); }, d.parameters(), rank, warmup, iters);
      // Correctness beside the timing: identical parameters on both ranks.
      tensor_list flat;
      for (const auto& p : m->parameters()) flat.push_back(p.detach().reshape({-1}));
      tensor mine = zeros({0});
      std::int64_t n = 0;
      for (const auto& f : flat) n += f.numel();
      mine = empty({n});
      std::int64_t off = 0;
      for (const auto& f : flat) {
        mine.narrow(0, off, f.numel()).copy_(f);
        off += f.numel();
      }
      tensor both = empty({2 * n});
      pg.allgather(both, mine).wait();
      const bool same = std::memcmp(both.data_ptr(), static_cast<char*>(both.data_ptr()) + n * 4, static_cast<std::size_t>(n) * 4) == 0;
      return result{s.median, s.p99, same ? 1 : 0};
    });
    if (!ddp_r.ok) throw error(errc::invalid_state, "ddp_bench: parameters differ across ranks after DDP steps");
    const result two = run_two([&](int rank, const ddp::file_store&) {
      auto m = make_mlp(rank);
      const auto s = time_steps([&](const tensor& x) { return m->forward(x); }, m->parameters(), rank, warmup, iters);
      return result{s.median, s.p99, 1};
    });
    auto m = make_mlp(0);
    const auto local = time_steps([&](const tensor& x) { return m->forward(x); }, m->parameters(), 0, warmup, iters);
    rep.add("ddp_step_ms", ddp_r.median_s * 1e3, "ms", params);
    rep.add("ddp_step_p99_ms", ddp_r.p99_s * 1e3, "ms", params);
    rep.add("limit_local_step_ms", local.median * 1e3, "ms", params);
    rep.add("ddp_overhead_ratio", ddp_r.median_s / local.median, "ratio", params);
    rep.add("local_step_2proc_ms", two.median_s * 1e3, "ms", params);
    rep.add("ddp_comm_overhead_ratio", ddp_r.median_s / two.median_s, "ratio", params);
  } catch (const error& e) {
    std::fprintf(stderr, "ddp_bench failed: %s\n", e.what());
    return 1;
  }
  rep.print_table();
  return 0;
}
