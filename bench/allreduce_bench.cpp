// CPU allreduce of the shared-memory process group, nccl-tests style. It runs 1, 25 and 100 MB
// of float32 on 2, 3 and 4 ranks, spawned on this host. It reports the median time of one
// allreduce(sum) and its bus bandwidth busbw = 2 (n - 1) / n * bytes / time. memcpy bandwidth
// measured in the same run is the limit. The first timed result is checked against the exact
// sum on every rank.
//
// Metrics (BENCH.md):
//   - allreduce_busbw_100mb_2r_gbps, allreduce_1mb_2r_ms (headline);
//   - allreduce_busbw_<S>mb_<N>r_gbps / allreduce_<S>mb_<N>r_ms for every size and rank count.
//     The tensors come from process_group::empty_shared, so the allreduce works in place in the
//     shared arena (Note [shm zero copy]; DDP's bucket buffers are made this way).
//   - allreduce_ordinary_busbw_<S>mb_<N>r_gbps and allreduce_ordinary_<S>mb_<N>r_ms: the same
//     for ordinary tensors, copied through the staging slots. The two kinds take turns
//     iteration by iteration in one group, so load from other processes hits both alike.
//   - limit_memcpy_gbps: bytes read + written per second, as tensor_bench;
//   - limit_memcpy_copy_gbps: bytes copied per second, the unit of busbw.
//   - The TCP ring (transport = tcp on loopback, Note [tcp ring]) on 2 ranks:
//     allreduce_tcp_busbw_<S>mb_2r_gbps / allreduce_tcp_<S>mb_2r_ms. Beside them is
//     limit_tcp_stream_gbps: one loopback socket pair streaming 100 MB in the same run.
// --quick: 2 ranks, few iterations.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>
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
  int tcp = 0;
  int shared = 0;
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

/// A tensor of `mb` MB holding rank + 1, in the shared arena or not.
tensor make_tensor(ddp::process_group& pg, int mb, bool shared) {
  const std::int64_t n = static_cast<std::int64_t>(mb) * (1 << 20) / 4;
  tensor t = shared ? pg.empty_shared({n}) : empty({n});
  if (shared && !pg.is_shared(t)) throw error(errc::invalid_state, "allreduce_bench: empty_shared gave an ordinary tensor");
  t.fill_(static_cast<double>(pg.rank() + 1));
  return t;
}

/// True when every element of `t` is the sum 1 + ... + world.
bool check_sum(const tensor& t, int world) {
  const float want = static_cast<float>(world * (world + 1) / 2);
  const float* v = t.data<float>();
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (v[i] != want) return false;
  return true;
}

/// Times allreduce(sum) of `mb` MB for each variant (shared arena or not), the variants taking
/// turns iteration by iteration so that a change of machine load hits them alike. The first
/// allreduce of each is checked against the exact sum.
std::vector<result> measure(ddp::process_group& pg, int mb, int iters, const std::vector<bool>& variants) {
  const int w = pg.world_size();
  std::vector<tensor> ts;
  std::vector<result> rs;
  for (bool shared : variants) {
    ts.push_back(make_tensor(pg, mb, shared));
    pg.allreduce(ts.back()).wait();
    rs.push_back(result{w, mb, 0, 0, check_sum(ts.back(), w) ? 1 : 0, 0, shared ? 1 : 0});
    ts.back().zero_();  // sums of zeros stay zeros: every later iteration does the same work
  }
  std::vector<std::vector<double>> times(variants.size());
  for (int i = 0; i < iters; ++i)
    for (std::size_t v = 0; v < variants.size(); ++v) {
      pg.barrier().wait();
      const auto t0 = tb::clock::now();
      pg.allreduce(ts[v]).wait();
      times[v].push_back(tb::seconds_since(t0));
    }
  for (std::size_t v = 0; v < variants.size(); ++v) {
    const auto s = tb::summarize(times[v]);
    rs[v].median_s = s.median;
    rs[v].p99_s = s.p99;
  }
  return rs;
}

/// Runs the sizes on `world` spawned ranks; rank 0 writes one result per size and variant.
void run_world(int world, bool quick, int out_fd, std::size_t slot_bytes, bool tcp, std::size_t tcp_chunk) {
  auto store = ddp::file_store::make_temp();
  auto ctx = spawn(world, [&](int rank) {
    ddp::process_group_options opts;
    opts.slot_bytes = slot_bytes;
    opts.transport = tcp ? ddp::transport_kind::tcp : ddp::transport_kind::shared_memory;
    opts.tcp_chunk_bytes = tcp_chunk;
    ddp::process_group pg(store, rank, world, "bench", opts);
    const std::vector<bool> variants = tcp ? std::vector<bool>{false} : std::vector<bool>{true, false};
    for (int mb : {1, 25, 100}) {
      const int iters = quick ? (mb == 1 ? 50 : 3) : (mb == 1 ? 400 : mb == 25 ? 30 : 12);
      for (result r : measure(pg, mb, iters, variants)) {
        r.tcp = tcp ? 1 : 0;
        if (rank == 0 && ::write(out_fd, &r, sizeof(r)) != static_cast<ssize_t>(sizeof(r)))
          throw error(errc::io_error, "allreduce_bench: result write");
        if (!r.ok) throw error(errc::invalid_state, "allreduce_bench: wrong allreduce result");
      }
    }
  });
  const bool done = ctx.join(std::chrono::minutes(5));
  store.remove_dir();
  if (!done) throw error(errc::timeout, "allreduce_bench: ranks did not finish");
}

/// One loopback TCP connection streaming `bytes` (in 1 MiB writes) from a thread to a reader:
/// seconds for the whole stream.
double tcp_stream_seconds(std::size_t bytes) {
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (ls < 0 || ::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(ls, 1) != 0 ||
      ::getsockname(ls, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw error(errc::io_error, "allreduce_bench: tcp listen");
  const int cs = ::socket(AF_INET, SOCK_STREAM, 0);
  if (::connect(cs, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) throw error(errc::io_error, "allreduce_bench: tcp connect");
  const int ss = ::accept(ls, nullptr, nullptr);
  const int big = 8 << 20, one = 1;
  for (int fd : {cs, ss}) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  std::vector<char> src(std::size_t{1} << 20, 1), dst(std::size_t{1} << 20);
  const auto t0 = tb::clock::now();
  std::thread writer([&] {
    for (std::size_t sent = 0; sent < bytes;) {
      const ssize_t k = ::send(cs, src.data(), std::min(src.size(), bytes - sent), MSG_NOSIGNAL);
      if (k <= 0) break;
      sent += static_cast<std::size_t>(k);
    }
  });
  std::size_t got = 0;
  for (ssize_t k; got < bytes && (k = ::recv(ss, dst.data(), dst.size(), 0)) > 0;) got += static_cast<std::size_t>(k);
  writer.join();
  const double secs = tb::seconds_since(t0);
  for (int fd : {cs, ss, ls}) ::close(fd);
  if (got != bytes) throw error(errc::io_error, "allreduce_bench: tcp stream short");
  return secs;
}

}  // namespace

int main(int argc, char** argv) {
  tb::check_args(argc, argv, "allreduce_bench",
                 "CPU allreduce of the shared-memory and TCP process groups (busbw against memcpy).",
                 {{"--tcp-only", "", "skip the shared-memory runs"},
                  {"--slot-kb", "N", "the pipeline chunk per rank, in KiB"},
                  {"--tcp-chunk-kb", "N", "the TCP ring's chunk, in KiB"}});
  const bool quick = tb::quick_mode(argc, argv);
  std::size_t slot_bytes = std::size_t{4} << 20;  // --slot-kb N: the pipeline chunk per rank
  std::size_t tcp_chunk = std::size_t{1} << 20;  // --tcp-chunk-kb N: the TCP ring's chunk
  bool tcp_only = false;                          // --tcp-only: skip the shared-memory runs
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--tcp-only") tcp_only = true;
    if (i + 1 == argc) continue;
    if (std::string(argv[i]) == "--slot-kb") slot_bytes = std::stoul(argv[i + 1]) << 10;
    if (std::string(argv[i]) == "--tcp-chunk-kb") tcp_chunk = std::stoul(argv[i + 1]) << 10;
  }
  tb::report rep("allreduce");
  try {
    const std::size_t bytes = std::size_t{100} << 20;
    std::vector<char> a(bytes, 1), b(bytes, 0);
    const auto m = tb::summarize(tb::time_runs(1, quick ? 3 : 10, [&] { std::memcpy(b.data(), a.data(), bytes); }));
    if (std::memcmp(a.data(), b.data(), bytes) != 0) throw error(errc::invalid_state, "memcpy check failed");
    rep.add("limit_memcpy_gbps", 2.0 * static_cast<double>(bytes) / m.median / 1e9, "GB/s", "\"bytes\": 104857600");
    rep.add("limit_memcpy_copy_gbps", static_cast<double>(bytes) / m.median / 1e9, "GB/s", "\"bytes\": 104857600");
    std::vector<double> stream;
    for (int i = 0; i < (quick ? 2 : 5); ++i) stream.push_back(tcp_stream_seconds(bytes));
    rep.add("limit_tcp_stream_gbps", static_cast<double>(bytes) / tb::summarize(stream).median / 1e9, "GB/s",
            "\"bytes\": 104857600");
    result_pipe pipe;
    // {world, tcp}: shared memory (in place and through the slots, interleaved) on 2-4 ranks,
    // the TCP ring on 2.
    std::vector<std::pair<int, bool>> runs = {{2, false}, {2, true}};
    if (!quick) runs = {{2, false}, {3, false}, {4, false}, {2, true}};
    if (tcp_only) runs = {{2, true}};
    for (auto [w, tcp] : runs) {
      run_world(w, quick, pipe.fds[1], slot_bytes, tcp, tcp_chunk);
      for (int k = 0; k < (tcp ? 3 : 6); ++k) {
        result r;
        pollfd p{pipe.fds[0], POLLIN, 0};
        if (::poll(&p, 1, 1000) != 1 || ::read(pipe.fds[0], &r, sizeof(r)) != static_cast<ssize_t>(sizeof(r)))
          throw error(errc::io_error, "allreduce_bench: missing result");
        const double nbytes = static_cast<double>(r.mb) * (1 << 20);
        const double busbw = 2.0 * (r.world - 1) / r.world * nbytes / r.median_s / 1e9;
        const std::string params = "\"ranks\": " + std::to_string(r.world) + ", \"mb\": " + std::to_string(r.mb) +
                                   ", \"p99_ms\": " + std::to_string(r.p99_s * 1e3);
        const std::string tag = std::to_string(r.mb) + "mb_" + std::to_string(r.world) + "r";
        const std::string kind = r.tcp ? "allreduce_tcp_" : r.shared ? "allreduce_" : "allreduce_ordinary_";
        rep.add(kind + "busbw_" + tag + "_gbps", busbw, "GB/s", params);
        rep.add(kind + tag + "_ms", r.median_s * 1e3, "ms", params);
      }
    }
  } catch (const error& e) {
    std::fprintf(stderr, "allreduce_bench failed: %s\n", e.what());
    return 1;
  }
  rep.print_table();
  return 0;
}
