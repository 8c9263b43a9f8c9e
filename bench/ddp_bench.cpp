// DDP training step of an MLP 1024-1024-1024-10 (2.1 M parameters), batch 64 per rank, 2 ranks
// on this host, against the same step without DDP. The comparison is made with the same CPU per
// rank: every rank (and the limit process) runs BLAS on cores / 2 threads, so 2 ranks x threads
// = cores. Correctness beside the timing: after the timed steps the parameters are bitwise
// identical on both ranks. Overlap beside the timing: each DDP step's reduction timeline
// (distributed_data_parallel::last_timeline) gives two figures. One is how much of the
// collectives' time fell before the last gradient was ready, hidden behind backward. The other
// is the tail after it.
//
// Metrics:
//   - ddp_step_ms: defaults, 25 MB buckets in the shared arena;
//   - limit_local_step_ms: one process, cores / 2 BLAS threads, the CPU one rank has;
//   - ddp_overhead_ratio: ddp / limit_local;
//   - local_step_2proc_ms and ddp_comm_overhead_ratio: the same step without DDP, alternating
//     step by step with the DDP steps in the same 2 processes. It has the same contention and
//     the same moment's load, and no communication.
//   - local_step_all_cores_ms and ddp_overhead_vs_all_cores_ratio: one process on every core,
//     what 2 ranks on this machine are up against;
//   - ddp_comm_hidden_fraction, ddp_tail_ms;
//   - ddp_step_as_view_ms: gradient_as_bucket_view;
//   - ddp_step_unshared_ms: bucket buffers outside the arena, the copying allreduce.
// --quick: few steps.
#include <dlfcn.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>
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
#include "troupe/tensors/nn_ops.hpp"

namespace tb = troupe::bench;
using namespace troupe;

namespace {

/// Sets OpenBLAS's thread count when the BLAS in use is OpenBLAS; false otherwise.
bool set_blas_threads(int n) {
  using setter = void (*)(int);
  auto fn = reinterpret_cast<setter>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (fn == nullptr) return false;
  fn(n);
  return true;
}

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

/// One training step (zero_grad, forward, MSE, backward, SGD) of a model, on fixed data.
struct stepper {
  std::function<tensor(const tensor&)> forward;
  optim::sgd opt;
  tensor x, y;
  stepper(std::function<tensor(const tensor&)> f, const tensor_list& params, int rank)
      : forward(std::move(f)), opt(params, {.lr = 1e-3}) {
    generator g(static_cast<std::uint64_t>(77 + rank));
    x = randn({64, 1024}, g);
    y = randn({64, 10}, g);
  }
  void operator()() {
    opt.zero_grad();
    backward(nn::mse_loss(forward(x), y));
    opt.step();
  }
};

/// Step times (seconds) of each stepper over `iters` iterations. The steppers take turns step
/// by step, so that load changes hit them alike. `after` runs after each step of the first.
std::vector<tb::stats> time_steps(std::vector<stepper*> steps, int warmup, int iters, const std::function<void()>& after = {}) {
  for (int i = 0; i < warmup; ++i)
    for (auto* s : steps) (*s)();
  std::vector<std::vector<double>> times(steps.size());
  for (int i = 0; i < iters; ++i)
    for (std::size_t k = 0; k < steps.size(); ++k) {
      const auto t0 = tb::clock::now();
      (*steps[k])();
      times[k].push_back(tb::seconds_since(t0));
      if (k == 0 && after) after();
    }
  std::vector<tb::stats> out;
  for (auto& t : times) out.push_back(tb::summarize(t));
  return out;
}

struct result {
  double median_s = 0, p99_s = 0;
  int ok = 0;
  double hidden = 0;   // median fraction of collective time before the last gradient
  double tail_ms = 0;  // median ms from the last gradient to the averaged gradients in place
  int buckets = 0;
  char timeline[240] = {};  // the last step's, for the table
  double local_s = 0;       // the same step without DDP, alternating with it in the same process
};

/// "b0 launched 5.1 done 6.0 | b1 ... | last grad 20.3 | done 21.7" (ms since the forward ended).
std::string describe(const ddp::reduction_timeline& tl) {
  char buf[96];
  std::string out;
  for (std::size_t b = 0; b < tl.launched_ms.size(); ++b) {
    std::snprintf(buf, sizeof(buf), "b%zu %.1f-%.1f | ", b, tl.launched_ms[b], tl.completed_ms[b]);
    out += buf;
  }
  std::snprintf(buf, sizeof(buf), "last grad %.1f | grads averaged %.1f", tl.last_grad_ms, tl.finished_ms);
  return out + buf;
}

/// Runs `body(rank, store)` on `n` spawned ranks; rank 0 returns its result through a pipe. The
/// bench's own process never runs BLAS, so no OpenBLAS thread pool exists when it forks.
/// Children forked after the parent used a 2-thread pool can step 2.8x slower.
result run_ranks(int n, const std::function<result(int, const ddp::file_store&)>& body) {
  int fds[2];
  if (::pipe(fds) != 0) throw error(errc::io_error, "ddp_bench: pipe");
  auto store = ddp::file_store::make_temp();
  result r;
  try {
    auto ctx = spawn(n, [&](int rank) {
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

/// True when the module's parameters are bitwise identical on both ranks.
bool same_on_both(ddp::process_group& pg, nn::module& m) {
  tensor_list flat;
  for (const auto& p : m.parameters()) flat.push_back(p.detach().reshape({-1}));
  const tensor mine = cat(flat, 0).contiguous();
  tensor both = empty({2 * mine.numel()});
  pg.allgather(both, mine).wait();
  return std::memcmp(both.data_ptr(), static_cast<char*>(both.data_ptr()) + mine.nbytes(), mine.nbytes()) == 0;
}

/// `iters` DDP steps on one rank with `opts`, with the overlap figures of each step. They
/// alternate with steps of the same model without DDP in the same process: same threads, same load.
result ddp_rank(int rank, const ddp::file_store& store, ddp::ddp_options opts, int threads, int warmup, int iters) {
  set_blas_threads(threads);
  ddp::process_group pg(store, rank, 2, "ddp_bench");
  auto m = make_mlp(rank);
  ddp::distributed_data_parallel d(m, pg, opts);
  auto plain = make_mlp(rank);
  stepper ddp_step([&](const tensor& x) { return d(x); }, d.parameters(), rank);
  stepper local_step([&](const tensor& x) { return plain->forward(x); }, plain->parameters(), rank);
  std::vector<double> hidden, tail;
  const auto s = time_steps({&ddp_step, &local_step}, warmup, iters, [&] {
    const auto tl = d.last_timeline();
    double total = 0, before = 0;
    for (std::size_t b = 0; b < tl.launched_ms.size(); ++b) {
      total += tl.completed_ms[b] - tl.launched_ms[b];
      before += std::max(0.0, std::min(tl.completed_ms[b], tl.last_grad_ms) - tl.launched_ms[b]);
    }
    hidden.push_back(total > 0 ? before / total : 0.0);
    tail.push_back(tl.finished_ms - tl.last_grad_ms);
  });
  result r{s[0].median, s[0].p99, same_on_both(pg, *m) ? 1 : 0, tb::summarize(hidden).median, tb::summarize(tail).median,
           static_cast<int>(d.bucket_assignment().size())};
  std::strncpy(r.timeline, describe(d.last_timeline()).c_str(), sizeof(r.timeline) - 1);
  r.local_s = s[1].median;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  tb::check_args(argc, argv, "ddp_bench",
                 "A DDP training step on 2 ranks against the same step without DDP.");
  const bool quick = tb::quick_mode(argc, argv);
  const int warmup = quick ? 2 : 5, iters = quick ? 5 : 40;
  const int cores = static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
  const int per_rank = cores / 2;
  const std::string params = "\"ranks\": 2, \"batch_per_rank\": 64, \"iters\": " + std::to_string(iters) +
                             ", \"cores\": " + std::to_string(cores) + ", \"blas_threads_per_rank\": " +
                             std::to_string(per_rank);
  tb::report rep("ddp");
  std::string last_timeline;
  try {
    if (::dlsym(RTLD_DEFAULT, "openblas_set_num_threads") == nullptr)
      std::fprintf(stderr, "ddp_bench: not OpenBLAS, BLAS threads left as they are\n");
    auto ddp_run = [&](ddp::ddp_options opts) {
      const result r = run_ranks(2, [&](int rank, const ddp::file_store& store) {
        return ddp_rank(rank, store, opts, per_rank, warmup, iters);
      });
      if (!r.ok) throw error(errc::invalid_state, "ddp_bench: parameters differ across ranks after DDP steps");
      return r;
    };
    auto local_run = [&](int threads) {
      return run_ranks(1, [&](int, const ddp::file_store&) {
        set_blas_threads(threads);
        auto m = make_mlp(0);
        stepper step([&](const tensor& x) { return m->forward(x); }, m->parameters(), 0);
        const auto s = time_steps({&step}, warmup, iters);
        return result{s[0].median, s[0].p99, 1};
      });
    };
    ddp::ddp_options view, unshared;
    view.gradient_as_bucket_view = true;
    unshared.shared_buckets = false;
    // The machine is shared: every configuration runs once per round, rounds interleave them,
    // and each figure is the median over the rounds (load changes hit all alike).
    std::vector<std::vector<result>> rounds(6);
    for (int round = 0; round < (quick ? 1 : 3); ++round) {
      rounds[0].push_back(ddp_run({}));
      rounds[1].push_back(ddp_run(view));
      rounds[2].push_back(ddp_run(unshared));
      rounds[3].push_back(rounds[0].back());
      rounds[3].back().median_s = rounds[0].back().local_s;  // the no-DDP steps of the DDP processes
      rounds[4].push_back(local_run(per_rank));
      rounds[5].push_back(local_run(cores));
      std::fprintf(stderr, "round %d: ddp %.1f ms, no-DDP in the ranks %.1f ms, alone %.1f ms, alone all cores %.1f ms\n",
                   round, rounds[0].back().median_s * 1e3, rounds[3].back().median_s * 1e3,
                   rounds[4].back().median_s * 1e3, rounds[5].back().median_s * 1e3);
    }
    auto med = [](std::vector<result> v) {
      std::sort(v.begin(), v.end(), [](const result& a, const result& b) { return a.median_s < b.median_s; });
      return v[v.size() / 2];
    };
    const result ddp_r = med(rounds[0]), view_r = med(rounds[1]), unshared_r = med(rounds[2]);
    const result two = med(rounds[3]), local = med(rounds[4]), local_all = med(rounds[5]);
    last_timeline = ddp_r.timeline;
    const std::string bparams = params + ", \"rounds\": " + std::to_string(rounds[0].size()) + ", \"buckets\": " +
                                std::to_string(ddp_r.buckets);
    rep.add("ddp_step_ms", ddp_r.median_s * 1e3, "ms", bparams);
    rep.add("ddp_step_p99_ms", ddp_r.p99_s * 1e3, "ms", bparams);
    rep.add("limit_local_step_ms", local.median_s * 1e3, "ms", params);
    rep.add("ddp_overhead_ratio", ddp_r.median_s / local.median_s, "ratio", params);
    rep.add("local_step_2proc_ms", two.median_s * 1e3, "ms", params);
    rep.add("ddp_comm_overhead_ratio", ddp_r.median_s / two.median_s, "ratio", params);
    rep.add("local_step_all_cores_ms", local_all.median_s * 1e3, "ms", params);
    rep.add("ddp_overhead_vs_all_cores_ratio", ddp_r.median_s / local_all.median_s, "ratio", params);
    rep.add("ddp_comm_hidden_fraction", ddp_r.hidden, "ratio", bparams);
    rep.add("ddp_tail_ms", ddp_r.tail_ms, "ms", bparams);
    rep.add("ddp_step_as_view_ms", view_r.median_s * 1e3, "ms", params);
    rep.add("ddp_step_unshared_ms", unshared_r.median_s * 1e3, "ms", params);
  } catch (const error& e) {
    std::fprintf(stderr, "ddp_bench failed: %s\n", e.what());
    return 1;
  }
  rep.print_table();
  std::printf("last DDP step of one round, rank 0 (ms after forward; bucket: launched-completed): %s\n",
              last_timeline.c_str());
  return 0;
}
