// CPU allreduce of the shared-memory process group, nccl-tests style: for 1, 25 and 100 MB of
// float32 on 2, 3 and 4 ranks (spawned on this host), the median time of one allreduce(sum) and
// its bus bandwidth busbw = 2 (n - 1) / n * bytes / time; memcpy bandwidth measured in the same
// run is the limit. The first timed result is checked against the exact sum on every rank.
//
// Metrics (BENCH.md): allreduce_busbw_100mb_2r_gbps, allreduce_1mb_2r_ms (headline), and
// allreduce_busbw_<S>mb_<N>r_gbps / allreduce_<S>mb_<N>r_ms for every size and rank count,
// limit_memcpy_gbps (bytes read + written per second, as tensor_bench), limit_memcpy_copy_gbps
// (bytes copied per second, the unit of busbw). --quick: 2 ranks, few iterations.
#include <poll.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/ddp/file_store.hpp"
#include "troupe/ddp/process_group.hpp"
#include "troupe/tensors/factories.hpp"

namespace tb = troupe::bench;
using namespace troupe;

namespace {

struct result {
  int world = 0;
  int mb = 0;
  double median_s = 0, p99_s = 0;
  int ok = 0;
};

/// Carries rank 0's results to the parent.
struct result_pipe {
  int fds[2] = {-1, -1};
  result_pipe() {
    if (::pipe(fds) != 0) throw error(errc::io_error, "allreduce_bench: pipe");
  }
  ~result_pipe() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
};

result measure(ddp::process_group& pg, int mb, int iters) {
  const std::int64_t n = static_cast<std::int64_t>(mb) * (1 << 20) / 4;
  tensor t = full({n}, static_cast<double>(pg.rank() + 1));
  const int w = pg.world_size();
  pg.allreduce(t).wait();
  const float want = static_cast<float>(w * (w + 1) / 2);
  result r{w, mb, 0, 0, t.data<float>()[0] == want && t.data<float>()[n - 1] == want && t.data<float>()[n / 2] == want};
  t.zero_();  // sums of zeros stay zeros: every later iteration does the same work
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    pg.barrier().wait();
    const auto t0 = tb::clock::now();
    pg.allreduce(t).wait();
    times.push_back(tb::seconds_since(t0));
  }
  const auto s = tb::summarize(times);
  r.median_s = s.median;
  r.p99_s = s.p99;
  return r;
}

void run_world(int world, bool quick, int out_fd, std::size_t slot_bytes) {
  auto store = ddp::file_store::make_temp();
  auto ctx = spawn(world, [&](int rank) {
    ddp::process_group_options opts;
    opts.slot_bytes = slot_bytes;
    ddp::process_group pg(store, rank, world, "bench", opts);
    for (int mb : {1, 25, 100}) {
      const int iters = quick ? (mb == 1 ? 50 : 3) : (mb == 1 ? 400 : mb == 25 ? 30 : 12);
      const result r = measure(pg, mb, iters);
      if (rank == 0 && ::write(out_fd, &r, sizeof(r)) != static_cast<ssize_t>(sizeof(r)))
        throw error(errc::io_error, "allreduce_bench: result write");
      if (!r.ok) throw error(errc::invalid_state, "allreduce_bench: wrong allreduce result");
    }
  });
  const bool done = ctx.join(std::chrono::minutes(5));
  store.remove_dir();
  if (!done) throw error(errc::timeout, "allreduce_bench: ranks did not finish");
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = tb::quick_mode(argc, argv);
  std::size_t slot_bytes = std::size_t{4} << 20;  // --slot-kb N: the pipeline chunk per rank
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--slot-kb") slot_bytes = std::stoul(argv[i + 1]) << 10;
  tb::report rep("allreduce");
  try {
    const std::size_t bytes = std::size_t{100} << 20;
    std::vector<char> a(bytes, 1), b(bytes, 0);
    const auto m = tb::summarize(tb::time_runs(1, quick ? 3 : 10, [&] { std::memcpy(b.data(), a.data(), bytes); }));
    if (std::memcmp(a.data(), b.data(), bytes) != 0) throw error(errc::invalid_state, "memcpy check failed");
    rep.add("limit_memcpy_gbps", 2.0 * static_cast<double>(bytes) / m.median / 1e9, "GB/s", "\"bytes\": 104857600");
    rep.add("limit_memcpy_copy_gbps", static_cast<double>(bytes) / m.median / 1e9, "GB/s", "\"bytes\": 104857600");
    result_pipe pipe;
    std::vector<int> worlds = quick ? std::vector<int>{2} : std::vector<int>{2, 3, 4};
    for (int w : worlds) {
      run_world(w, quick, pipe.fds[1], slot_bytes);
      for (int k = 0; k < 3; ++k) {
        result r;
        pollfd p{pipe.fds[0], POLLIN, 0};
        if (::poll(&p, 1, 1000) != 1 || ::read(pipe.fds[0], &r, sizeof(r)) != static_cast<ssize_t>(sizeof(r)))
          throw error(errc::io_error, "allreduce_bench: missing result");
        const double nbytes = static_cast<double>(r.mb) * (1 << 20);
        const double busbw = 2.0 * (r.world - 1) / r.world * nbytes / r.median_s / 1e9;
        const std::string params = "\"ranks\": " + std::to_string(r.world) + ", \"mb\": " + std::to_string(r.mb) +
                                   ", \"p99_ms\": " + std::to_string(r.p99_s * 1e3);
        const std::string tag = std::to_string(r.mb) + "mb_" + std::to_string(r.world) + "r";
        rep.add("allreduce_busbw_" + tag + "_gbps", busbw, "GB/s", params);
        rep.add("allreduce_" + tag + "_ms", r.median_s * 1e3, "ms", params);
      }
    }
  } catch (const error& e) {
    std::fprintf(stderr, "allreduce_bench failed: %s\n", e.what());
    return 1;
  }
  rep.print_table();
  return 0;
}
