// The cost of the always-on flight recorder (Note [flight recorder]) and hang blame (Note [hang
// blame]) on a DDP training step. The step is an MLP 1024-1024-1024-10, batch 64 per rank, 2
// ranks on this host. Each rank trains two copies of the model in the same process, step by step
// in turn. One is over a process group with a recorder and the blame watch, the defaults a node
// gives. The other is over a group with neither. So both see the same load at the same moment.
// Correctness beside the timing: both copies' parameters are bitwise identical on both ranks and
// equal to each other (the recorder changes no result).
//
// Metrics:
//   - recorder_overhead_ratio: step with / step without; goal <= 1.02;
//   - ddp_step_recorder_on_ms, ddp_step_recorder_off_ms;
//   - recorder_begin_end_us: one recorded operation, begin + end, on one thread.
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
#include "troupe/actors/flight_recorder.hpp"
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

void set_blas_threads(int n) {
  using setter = void (*)(int);
  if (auto fn = reinterpret_cast<setter>(::dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(n);
}

std::shared_ptr<nn::sequential> make_mlp() {
  generator g(11);
  auto m = std::make_shared<nn::sequential>();
  m->push_back(std::make_shared<nn::linear>(1024, 1024, g));
  m->push_back(std::make_shared<nn::relu>());
  m->push_back(std::make_shared<nn::linear>(1024, 1024, g));
  m->push_back(std::make_shared<nn::relu>());
  m->push_back(std::make_shared<nn::linear>(1024, 10, g));
  return m;
}

/// One DDP copy of the model with its group, optimizer and fixed data.
struct replica {
  ddp::process_group pg;
  std::shared_ptr<nn::sequential> model = make_mlp();
  ddp::distributed_data_parallel ddp_model;
  optim::sgd opt;
  tensor x, y;
  replica(const ddp::file_store& store, int rank, const std::string& name, ddp::process_group_options opts)
      : pg(store, rank, 2, name, opts), ddp_model(model, pg), opt(ddp_model.parameters(), {.lr = 1e-3}) {
    generator g(static_cast<std::uint64_t>(77 + rank));
    x = randn({64, 1024}, g);
    y = randn({64, 10}, g);
  }
  void step() {
    opt.zero_grad();
    backward(nn::mse_loss(ddp_model(x), y));
    opt.step();
  }
  tensor flat() const {
    tensor_list parts;
    for (const auto& p : model->parameters()) parts.push_back(p.detach().reshape({-1}));
    return cat(parts, 0).contiguous();
  }
};

struct result {
  double on_s = 0, off_s = 0;
  int ok = 0;
};

/// Steps both replicas in turn; rank 0's medians, and whether every copy agrees bit for bit.
result rank_main(int rank, const ddp::file_store& store, int threads, int warmup, int iters) {
  set_blas_threads(threads);
  ddp::process_group_options on, off;
  on.recorder = std::make_shared<flight_recorder>(1024);
  off.blame_after = std::chrono::milliseconds(0);
  replica a(store, rank, "recorder_on", on), b(store, rank, "recorder_off", off);
  for (int i = 0; i < warmup; ++i) a.step(), b.step();
  std::vector<double> ta, tbv;
  for (int i = 0; i < iters; ++i) {
    // Alternate which goes first, so neither always follows the other.
    replica* first = i % 2 ? &b : &a;
    replica* second = i % 2 ? &a : &b;
    auto t0 = tb::clock::now();
    first->step();
    (i % 2 ? tbv : ta).push_back(tb::seconds_since(t0));
    t0 = tb::clock::now();
    second->step();
    (i % 2 ? ta : tbv).push_back(tb::seconds_since(t0));
  }
  const tensor fa = a.flat(), fb = b.flat();
  tensor both = empty({2 * fa.numel()});
  a.pg.allgather(both, fa).wait();
  const bool same = std::memcmp(fa.data_ptr(), fb.data_ptr(), fa.nbytes()) == 0 &&
                    std::memcmp(both.data_ptr(), static_cast<char*>(both.data_ptr()) + fa.nbytes(), fa.nbytes()) == 0;
  return result{tb::summarize(ta).median, tb::summarize(tbv).median, same ? 1 : 0};
}

result run_ranks(int threads, int warmup, int iters) {
  int fds[2];
  if (::pipe(fds) != 0) throw error(errc::io_error, "recorder_bench: pipe");
  auto store = ddp::file_store::make_temp();
  result r;
  bool got = false;
  try {
    auto ctx = spawn(2, [&](int rank) {
      const result mine = rank_main(rank, store, threads, warmup, iters);
      if (rank == 0 && ::write(fds[1], &mine, sizeof(mine)) != static_cast<ssize_t>(sizeof(mine)))
        throw error(errc::io_error, "recorder_bench: result write");
    });
    if (!ctx.join(std::chrono::minutes(5))) throw error(errc::timeout, "recorder_bench: ranks did not finish");
    pollfd p{fds[0], POLLIN, 0};
    got = ::poll(&p, 1, 1000) == 1 && ::read(fds[0], &r, sizeof(r)) == static_cast<ssize_t>(sizeof(r));
  } catch (...) {
    store.remove_dir();
    ::close(fds[0]);
    ::close(fds[1]);
    throw;
  }
  store.remove_dir();
  ::close(fds[0]);
  ::close(fds[1]);
  if (!got) throw error(errc::io_error, "recorder_bench: missing result");
  return r;
}

/// Seconds per begin + end of one recorded operation on one thread.
double begin_end_seconds(int iters) {
  flight_recorder rec(1024);
  const auto t0 = tb::clock::now();
  for (int i = 0; i < iters; ++i) rec.end(rec.begin(trace_kind::collective, "allreduce", static_cast<std::uint64_t>(i), "bucket 0"));
  return tb::seconds_since(t0) / iters;
}

}  // namespace

int main(int argc, char** argv) {
  tb::check_args(argc, argv, "recorder_bench",
                 "The flight recorder's and hang blame's cost on a DDP step, with and without, in the same run.");
  const bool quick = tb::quick_mode(argc, argv);
  const int warmup = quick ? 2 : 5, iters = quick ? 6 : 60;
  const int cores = static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
  const std::string params = "\"ranks\": 2, \"batch_per_rank\": 64, \"iters\": " + std::to_string(iters) +
                             ", \"blas_threads_per_rank\": " + std::to_string(cores / 2);
  tb::report rep("supervision");
  try {
    const result r = run_ranks(cores / 2, warmup, iters);
    if (!r.ok) throw error(errc::invalid_state, "recorder_bench: parameters differ between the copies or the ranks");
    rep.add("recorder_overhead_ratio", r.on_s / r.off_s, "ratio", params);
    rep.add("ddp_step_recorder_on_ms", r.on_s * 1e3, "ms", params);
    rep.add("ddp_step_recorder_off_ms", r.off_s * 1e3, "ms", params);
    const int n = quick ? 100000 : 2000000;
    rep.add("recorder_begin_end_us", begin_end_seconds(n) * 1e6, "us", "\"iters\": " + std::to_string(n));
  } catch (const error& e) {
    std::fprintf(stderr, "recorder_bench failed: %s\n", e.what());
    return 1;
  }
  rep.print_table();
  return 0;
}
