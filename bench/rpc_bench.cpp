// rpc_bench: the RPC runtime against its limits (BENCH.md). Two processes on loopback: this one
// (rank 0, the caller) and a forked server (rank 1); a third (rank 2) is SIGKILLed to time the
// supervision path. The raw TCP ping-pong and memcpy limits are measured in the same run.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <malloc.h>
#include <sys/resource.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <thread>

#include "bench_node.hpp"
#include "bench_util.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/shared_memory.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/tensors/factories.hpp"

using namespace std::chrono_literals;
namespace tb = troupe::bench;

namespace {

// --no-shm: large tensors as bytes on the connection, not through shared memory
// (node_options::shared_memory_rpc = false; Note [shm reachability]).
bool g_shm = true;

troupe::node_options options(int rank, std::uint16_t port) {
  auto o = troupe::bench::bench_node_options(rank, 3, port);
  o.shared_memory_rpc = g_shm;
  return o;
}

int tcp_socket_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// A forked process connected to this one over loopback TCP, running `serve` on its end (it exits
// when that returns); `fd` is this process's end (-1 if the setup failed). The destructor closes
// it (which ends a serve loop on EOF) and reaps the child.
struct forked_peer {
  int fd = -1;
  int lfd = -1;
  pid_t pid = -1;
  template <class Serve>
  explicit forked_peer(Serve serve) {
    lfd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(lfd, 1) != 0) return;
    ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
    pid = ::fork();
    if (pid == 0) {
      const int c = tcp_socket_nodelay(::socket(AF_INET, SOCK_STREAM, 0));
      if (::connect(c, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) ::_exit(1);
      serve(c);
      ::_exit(0);
    }
    fd = tcp_socket_nodelay(::accept(lfd, nullptr, nullptr));
  }
  ~forked_peer() {
    if (fd >= 0) ::close(fd);
    if (lfd >= 0) ::close(lfd);
    if (pid > 0) ::waitpid(pid, nullptr, 0);
  }
  forked_peer(const forked_peer&) = delete;
  forked_peer& operator=(const forked_peer&) = delete;
};

// Raw TCP 1-byte ping-pong on loopback with a forked echo process; returns the round trips in us.
// `copy_before`: each round trip comes right after a copy of that many bytes on this thread.
// That is the limit for a small call made right after rpc_async copied a large tensor in. The
// caller has just run for milliseconds, and the echo process has slept as long.
std::vector<double> tcp_pingpong(int iters, std::size_t copy_before = 0) {
  forked_peer peer([](int c) {
    char b = 0;
    while (::recv(c, &b, 1, 0) == 1)
      if (::send(c, &b, 1, 0) != 1) break;
  });
  if (peer.fd < 0) return {};
  std::vector<double> out;
  std::vector<char> from(copy_before, 1), to(copy_before, 0);
  char b = 1;
  for (int i = 0; i < iters + iters / 10; ++i) {
    if (copy_before > 0) std::memcpy(to.data(), from.data(), copy_before);
    const auto t0 = tb::clock::now();
    if (::send(peer.fd, &b, 1, 0) != 1 || ::recv(peer.fd, &b, 1, MSG_WAITALL) != 1) break;
    if (i >= iters / 10) out.push_back(tb::seconds_since(t0) * 1e6);
  }
  return out;
}

// Raw TCP echo of `bytes` on loopback: the limit for a tensor echo as bytes (--no-shm). A forked
// process sends back everything it reads. This one sends from one thread while it reads the echo
// on another. Returns the round trips in ms.
std::vector<double> tcp_echo_ms(std::size_t bytes, int iters) {
  forked_peer peer([](int c) {
    std::vector<char> buf(1 << 20);
    for (;;) {
      const ssize_t k = ::recv(c, buf.data(), buf.size(), 0);
      if (k <= 0) return;
      for (ssize_t off = 0; off < k;) {
        const ssize_t w = ::send(c, buf.data() + off, static_cast<std::size_t>(k - off), 0);
        if (w <= 0) return;
        off += w;
      }
    }
  });
  if (peer.fd < 0) return {};
  const int fd = peer.fd;
  std::vector<char> out(bytes, 5), in(bytes);
  std::vector<double> ms;
  for (int i = 0; i < iters + 1; ++i) {
    const auto t0 = tb::clock::now();
    std::thread sender([&] {
      for (std::size_t off = 0; off < bytes;) {
        const ssize_t w = ::send(fd, out.data() + off, bytes - off, 0);
        if (w <= 0) return;
        off += static_cast<std::size_t>(w);
      }
    });
    std::size_t got = 0;
    while (got < bytes) {
      const ssize_t k = ::recv(fd, in.data() + got, bytes - got, 0);
      if (k <= 0) break;
      got += static_cast<std::size_t>(k);
    }
    sender.join();
    if (i > 0) ms.push_back(tb::seconds_since(t0) * 1e3);  // the first one warms the buffers
  }
  return ms;
}

double memcpy_gbps(std::size_t bytes, int iters) {
  std::vector<char> a(bytes, 1), b(bytes, 0);
  auto runs = tb::time_runs(2, iters, [&] { std::memcpy(b.data(), a.data(), bytes); });
  return static_cast<double>(bytes) / tb::summarize(runs).median / 1e9;
}

void serve(int rank, std::uint16_t port) {
  troupe::node n(options(rank, port));
  n.functions().add("noop", [](int x) { return x; });
  n.functions().add("echo", [](troupe::tensor t) { return t; });
  n.functions().add("block", [](int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));  // a call in flight when killed
    return ms;
  });
  n.store().set("ready/" + std::to_string(rank), "1");
  n.store().get("done", 600s);
}

// Minor page faults so far of this process and of `child` (/proc/<pid>/stat field 10).
double page_faults(pid_t child) {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  double n = static_cast<double>(ru.ru_minflt);
  std::ifstream stat("/proc/" + std::to_string(child) + "/stat");
  std::string field;
  for (int i = 1; i <= 10 && stat >> field; ++i)
    if (i == 10) n += std::stod(field);
  return n;
}

// `server`: the echoing child, whose page faults count too (Note [tensor over shared memory]:
// pooled, pre-faulted segments should leave next to none per echo).
void echo_metrics(troupe::node& n, tb::report& rep, std::size_t bytes, int iters, const std::string& name, pid_t server) {
  auto t = troupe::empty({static_cast<std::int64_t>(bytes / 4)}, troupe::dtype::float32);
  std::memset(t.data_ptr(), 7, t.nbytes());
  troupe::tensor back;
  // Warm-up outside the fault count: while `back` holds one segment the next echo needs a second
  // one, so the steady state alternates between two (each created and faulted in once).
  for (int i = 0; i < 2; ++i) back = troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", t);
  const double faults0 = page_faults(server);
  auto runs = tb::time_runs(0, iters, [&] { back = troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", t); });
  const double faults = (page_faults(server) - faults0) / iters;
  if (back.nbytes() != t.nbytes() || std::memcmp(back.data_ptr(), t.data_ptr(), t.nbytes()) != 0)
    throw troupe::error(troupe::errc::protocol_violation, "tensor echo returned different bytes");
  const auto s = tb::summarize(runs);
  const std::string p = "\"bytes\": " + std::to_string(bytes) + ", \"iters\": " + std::to_string(iters);
  rep.add("tensor_echo_" + name + "_gbps", static_cast<double>(bytes) / s.median / 1e9, "GB/s", p);
  rep.add("tensor_echo_" + name + "_rtt_ms", s.median * 1e3, "ms", p);
  rep.add("page_faults_per_" + name + "_echo", faults, "count", p);
  // As bytes the limit is the kernel's: the same echo over a raw TCP socket pair.
  if (!g_shm) rep.add("limit_tcp_echo_" + name + "_ms", tb::summarize(tcp_echo_ms(bytes, std::max(3, iters / 4))).median, "ms", p);
}

}  // namespace

namespace {

// A share_memory_() tensor travels by handle both ways, with no copy at all; each side maps the
// other's segment. So the round trip is the mapping work, independent of the bytes touched later.
void shared_echo_metric(troupe::node& n, tb::report& rep, int iters) {
  troupe::shm_provider provider(troupe::sharing_strategy::file_descriptor, "rpcbench");
  auto t = troupe::empty({16 << 20}, troupe::dtype::float32);
  std::memset(t.data_ptr(), 3, t.nbytes());
  troupe::share_memory_(t, provider);
  troupe::tensor back;
  auto runs = tb::time_runs(2, iters, [&] { back = troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", t); });
  if (!troupe::is_shared(back) || std::memcmp(back.data_ptr(), t.data_ptr(), t.nbytes()) != 0)
    throw troupe::error(troupe::errc::protocol_violation, "shared tensor echo returned different bytes");
  rep.add("tensor_echo_64mb_shared_rtt_ms", tb::summarize(runs).median * 1e3, "ms", "\"iters\": " + std::to_string(iters));
}

double small_rtt_metrics(troupe::node& n, tb::report& rep, int iters) {
  int sink = 0;
  auto runs = tb::time_runs(iters / 10, iters, [&] { sink += troupe::rpc_sync<int>(n, "worker1", "noop", 1); });
  for (auto& r : runs) r *= 1e6;
  const auto s = tb::summarize(runs);
  const std::string p = "\"iters\": " + std::to_string(iters);
  rep.add("rpc_sync_small_rtt_median_us", s.median, "us", p);
  rep.add("rpc_sync_small_rtt_p99_us", s.p99, "us", p);
  return s.median;
}

void async_metrics(troupe::node& n, tb::report& rep, int calls) {
  constexpr int window = 2000;  // bounded in-flight calls (CAF never throttles sends)
  const auto t0 = tb::clock::now();
  for (int done = 0; done < calls; done += window) {
    std::vector<troupe::rpc::future<int>> fs;
    fs.reserve(window);
    for (int i = 0; i < window; ++i) fs.push_back(troupe::rpc_async<int>(n, "worker1", "noop", i));
    if (!troupe::rpc::wait_all(fs, 30s)) throw troupe::error(troupe::errc::timeout, "async window did not complete");
    if (fs.back().get() != window - 1) throw troupe::error(troupe::errc::protocol_violation, "async result mismatch");
  }
  rep.add("rpc_async_throughput_calls_per_s", calls / tb::seconds_since(t0), "calls/s",
          "\"calls\": " + std::to_string(calls) + ", \"window\": " + std::to_string(window));
}

// The small call while a 64 MB transfer is in flight (the headline). 64 MB echoes run back to
// back on another thread. Only the small calls issued while one of them is under way count: its
// copy into the segment, the callee's side or the copy back. Then the same small call is made
// right after this thread's own rpc_async of 64 MB. That call pays for the copy that rpc_async
// did on its thread just before: caches cold, the peer asleep for milliseconds. The same call
// after the same copy with no transfer at all measures that cost. Raw TCP pays it too.
void during_transfer_metrics(troupe::node& n, tb::report& rep, int rounds, double idle_us, bool quick) {
  auto big = troupe::empty({16 << 20}, troupe::dtype::float32);  // 64 MB
  std::memset(big.data_ptr(), 1, big.nbytes());
  {
    std::atomic<bool> stop{false};
    std::atomic<bool> moving{false};
    std::atomic<int> echoes{0};
    std::thread mover([&] {
      while (!stop) {
        moving = true;
        troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", big);
        moving = false;
        ++echoes;
      }
    });
    while (echoes < 1) std::this_thread::sleep_for(1ms);  // segments created and faulted in
    const int first = echoes;
    std::vector<double> lat;
    int calls = 0;
    for (; calls < rounds * 100 || echoes - first < (quick ? 2 : 4); ++calls) {
      const bool in_flight = moving;
      const auto t0 = tb::clock::now();
      troupe::rpc_sync<int>(n, "worker1", "noop", calls);
      if (in_flight) lat.push_back(tb::seconds_since(t0) * 1e6);
    }
    stop = true;
    mover.join();
    if (lat.empty()) throw troupe::error(troupe::errc::protocol_violation, "no small call was issued during an echo");
    const auto s = tb::summarize(lat);
    const std::string p = "\"calls\": " + std::to_string(calls) + ", \"issued_in_flight\": " +
                          std::to_string(lat.size()) + ", \"echoes\": " + std::to_string(echoes - first);
    rep.add("small_rtt_during_64mb_us", s.median, "us", p);
    rep.add("small_rtt_during_64mb_p99_us", s.p99, "us", p);
    rep.add("small_rtt_during_64mb_ratio", s.median / idle_us, "ratio", "\"goal\": 2");
  }
  // The limit for a call right after a 64 MB copy: raw TCP right after the same copy.
  const double tcp_after_copy = tb::summarize(tcp_pingpong(quick ? 10 : 50, 64u << 20)).median;
  rep.add("limit_tcp_pingpong_after_64mb_copy_us", tcp_after_copy, "us");
  std::vector<double> lat;
  for (int i = 0; i < rounds; ++i) {
    auto f = troupe::rpc_async<troupe::tensor>(n, "worker1", "echo", big);
    const auto t0 = tb::clock::now();
    troupe::rpc_sync<int>(n, "worker1", "noop", i);
    lat.push_back(tb::seconds_since(t0) * 1e6);
    f.get();
  }
  const double right_after = tb::summarize(lat).median;
  const std::string r = "\"rounds\": " + std::to_string(rounds);
  rep.add("small_rtt_right_after_64mb_async_us", right_after, "us", r);
  rep.add("small_rtt_right_after_64mb_async_ratio", right_after / idle_us, "ratio", r);
  rep.add("small_rtt_right_after_64mb_async_ratio_to_tcp_after_copy", right_after / tcp_after_copy, "ratio", r);
  // The same 64 MB copy on this thread (as rpc_async's copy-in), and the callee idle as long.
  // But nothing is in flight, so the transfer's own share is the ratio of the two.
  auto scratch = troupe::empty({16 << 20}, troupe::dtype::float32);
  std::vector<double> after;
  for (int i = 0; i < rounds; ++i) {
    std::memcpy(scratch.data_ptr(), big.data_ptr(), big.nbytes());
    const auto t0 = tb::clock::now();
    troupe::rpc_sync<int>(n, "worker1", "noop", i);
    after.push_back(tb::seconds_since(t0) * 1e6);
  }
  const double copy_only = tb::summarize(after).median;
  rep.add("small_rtt_after_64mb_copy_us", copy_only, "us", r);
  rep.add("small_rtt_right_after_64mb_async_ratio_to_same_copy_without_transfer", right_after / copy_only, "ratio", r);
}

void peer_loss_metric(troupe::node& n, tb::report& rep, troupe::spawn_context& children) {
  auto f = troupe::rpc_async<int>(n, "worker2", "block", 60000);
  troupe::rpc_sync<int>(n, "worker2", "noop", 0);  // the block call is now running remotely
  const auto t0 = tb::clock::now();
  children.kill(1, SIGKILL);
  if (!f.wait(10s)) throw troupe::error(troupe::errc::timeout, "peer loss not detected in 10 s");
  const double ms = tb::seconds_since(t0) * 1e3;
  try {
    f.get();
  } catch (const troupe::error& e) {
    if (e.code() != troupe::errc::peer_lost) throw;
  }
  rep.add("peer_loss_detect_ms", ms, "ms");
}

}  // namespace

int main(int argc, char** argv) {
  tb::check_args(argc, argv, "rpc_bench",
                 "The RPC runtime against its limits (TCP ping-pong, memcpy) on loopback.",
                 {{"--no-mallopt", "", "leave malloc's trim and mmap thresholds alone"},
                  {"--no-shm", "", "large tensors as bytes, not through shared memory"},
                  {"--only", "small|during|async|echo", "one phase (for profiling)"}});
  const bool quick = tb::quick_mode(argc, argv);
  // Keep freed 64 MB buffers in the heap instead of returning them to the kernel. Otherwise each
  // message pays ~16k page faults for fresh pages. Page faults are then the top cost of the
  // 64 MB echo. Applies to the forked children as well. Pass --no-mallopt to compare.
  bool tune = true;
  // --only small|during|async|echo: the small round trips only, or those plus one phase. The
  // phase is the during-transfer one (200 rounds), the async one, or the 1 MB and 64 MB echoes
  // (1000 and 20 rounds). It serves profiling (perf, strace) and A/B runs without the others.
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--no-mallopt") == 0) tune = false;
    if (std::strcmp(argv[i], "--no-shm") == 0) g_shm = false;
    if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc) only = argv[++i];
  }
  if (!only.empty() && only != "small" && only != "during" && only != "async" && only != "echo") {
    std::fprintf(stderr, "rpc_bench: --only takes small, during, async or echo, not '%s'\n", only.c_str());
    return 2;
  }
  if (tune) {
    ::mallopt(M_MMAP_THRESHOLD, 512 << 20);
    ::mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  tb::report rep("rpc");
  const auto tcp = tb::summarize(tcp_pingpong(quick ? 2000 : 20000));
  rep.add("limit_tcp_pingpong_median_us", tcp.median, "us");
  rep.add("limit_memcpy_gbps", memcpy_gbps(64u << 20, quick ? 5 : 20), "GB/s", "\"bytes\": 67108864");

  const std::uint16_t port = troupe::bench::free_loopback_port();
  auto children = troupe::spawn(2, [port](int i) { serve(i + 1, port); });
  try {
    troupe::node n(options(0, port));
    n.store().wait({"ready/1", "ready/2"}, 30s);
    const double idle_us = small_rtt_metrics(n, rep, quick ? 2000 : 20000);
    rep.add("rpc_sync_small_rtt_ratio_to_tcp", idle_us / tcp.median, "ratio", "\"goal\": 1.5");
    if (only == "during") during_transfer_metrics(n, rep, 200, idle_us, quick);
    if (only == "async") async_metrics(n, rep, quick ? 20000 : 200000);
    if (only == "echo") {
      echo_metrics(n, rep, 1u << 20, quick ? 20 : 1000, "1mb", children.pids().at(0));
      echo_metrics(n, rep, 64u << 20, quick ? 3 : 20, "64mb", children.pids().at(0));
    }
    if (!only.empty()) {
      n.store().set("done", "1");
      n.shutdown(troupe::shutdown_mode::immediate);
      rep.print_table();
      children.join(10s);
      return 0;
    }
    async_metrics(n, rep, quick ? 20000 : 200000);
    const pid_t server = children.pids().at(0);
    echo_metrics(n, rep, 1u << 20, quick ? 20 : 200, "1mb", server);
    echo_metrics(n, rep, 64u << 20, quick ? 3 : 10, "64mb", server);
    if (g_shm) shared_echo_metric(n, rep, quick ? 5 : 50);  // with --no-shm it arrives as a copy
    during_transfer_metrics(n, rep, quick ? 3 : 50, idle_us, quick);
    peer_loss_metric(n, rep, children);
    n.store().set("done", "1");
    n.shutdown(troupe::shutdown_mode::immediate);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rpc_bench failed: %s\n", e.what());
    return 1;
  }
  rep.print_table();
  try {
    children.join(10s);
  } catch (const troupe::error&) {
    // rank 2 was SIGKILLed on purpose
  }
  return 0;
}
