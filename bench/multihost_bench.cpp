// multihost_bench: figures between two namespace hosts of the multi-host test bed
// (tools/netns_bed.sh; needs root):
//   - the limits: raw TCP ping-pong, stream, 64 MB echo and full-duplex stream (Note [limits on
//     one machine] in multihost_roles.hpp);
//   - rpc_sync round trip, 64 MB echo (also with TLS);
//   - TCP allreduce of 100 MB on 2 hosts x 1 and 2 x 2 ranks, the hierarchical allreduce on
//     2 x 2 ranks;
//   - the time from a cut to peer_lost: an rpc's caller, and every survivor of a hierarchical
//     allreduce.
// The orchestrator (no --role) makes the bed and runs each role on its host (this binary
// again). It reports what they measured. Without namespaces it prints why and exits 0.
#include <fcntl.h>
#include <sys/wait.h>

#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include "bench_util.hpp"
#include "ddp/tls_test_certs.hpp"
#include "multihost_orchestrator.hpp"
#include "multihost_roles.hpp"
#include "troupe/actors/host_address.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/ddp/hierarchical_group.hpp"
#include "troupe/ddp/process_group.hpp"
#include "troupe/tensors/factories.hpp"

namespace tb = troupe::bench;
using namespace std::chrono_literals;

namespace {

const char* const port_env = "29600";

troupe::node_options role_options() {
  auto o = troupe::node_options::from_env();
  o.default_timeout = 60s;
  o.join_timeout = 30s;
  return o;
}

// Rank 0 (host 0) calls rank 1 (host 1): small rpc_sync round trips and 64 MB echoes. With
// `tls_dir` (the certificates of tests/ddp/tls_test_certs.hpp), both nodes use TLS and the
// figures are named mh_tls_*.
int role_rpc(bool quick, const std::string& tls_dir) {
  troupe::rpc::registry reg;
  reg.add("noop", [](int x) { return x; });
  reg.add("echo", [](troupe::tensor t) { return t; });
  auto o = role_options();
  if (!tls_dir.empty()) o.tls = {tls_dir + "rank.crt", tls_dir + "rank.key", tls_dir + "ca.crt"};
  const std::string prefix = tls_dir.empty() ? "mh_" : "mh_tls_";
  troupe::node n(o, reg);
  const int me = n.info().rank;
  n.store().barrier("up", me, 2, 30s);
  if (me == 0) {
    const int iters = quick ? 300 : 5000;
    const auto rtt = tb::summarize(tb::time_runs(iters / 10, iters, [&] { troupe::rpc_sync<int>(n, "worker1", "noop", 1); }));
    tb::mh::emit(prefix + "rpc_sync_small_rtt_median_us", rtt.median * 1e6, "us", "\"iters\": " + std::to_string(iters));
    const auto big = troupe::zeros({16 << 20});  // 64 MB of float32
    const int reps = quick ? 2 : 10;
    const auto echo = tb::summarize(tb::time_runs(1, reps, [&] {
      if (troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", big).numel() != big.numel()) throw std::runtime_error("bad echo");
    }));
    tb::mh::emit(prefix + "tensor_echo_64mb_gbps", 64.0 * (1 << 20) / echo.median / 1e9, "GB/s", "\"iters\": " + std::to_string(reps));
  }
  n.store().barrier("done", me, 2, 120s);
  n.shutdown(troupe::shutdown_mode::graceful, 10s);
  return 0;
}

// Every rank: allreduce of 100 MB over the TCP process group, or over the hierarchical group
// (shared memory within a host, TCP between the hosts' leaders). Rank 0 reports busbw, with the
// ring formula for both: 2 (w - 1) / w bytes per rank.
int role_allreduce(bool quick, bool hier) {
  const auto o = role_options();
  troupe::node n(o);
  const int me = n.info().rank, world = n.info().world_size;
  {
    troupe::ddp::process_group_options po;
    po.tcp_address = troupe::advertised_address(o.listen_addr, o.master_addr);
    po.transport = troupe::ddp::transport_kind::tcp;
    std::unique_ptr<troupe::ddp::collective_group> pg;
    if (hier) pg = std::make_unique<troupe::ddp::hierarchical_group>(n.store(), me, world, "mh-bench-h", po);
    else pg = std::make_unique<troupe::ddp::process_group>(n.store(), me, world, "mh-bench", po);
    const std::int64_t elems = (quick ? 10 : 100) * (1 << 20) / 4;
    auto t = pg->make_buffer({elems}, troupe::dtype::float32);
    t.fill_(1.0);
    const int reps = quick ? 1 : 5;
    const auto s = tb::summarize(tb::time_runs(1, reps, [&] { pg->allreduce(t).wait(120s); }));
    const double bytes = static_cast<double>(elems) * 4;
    const double busbw = bytes * 2.0 * (world - 1) / world / s.median / 1e9;
    const std::string name = hier ? "mh_allreduce_busbw_100mb_2h2r_hier_gbps"
                             : world == 2 ? "mh_allreduce_busbw_100mb_2h_gbps"
                                          : "mh_allreduce_busbw_100mb_2h2r_gbps";
    if (me == 0)
      tb::mh::emit(name, busbw, "GB/s",
                   "\"bytes\": " + std::to_string(static_cast<long long>(bytes)) + ", \"ranks\": " + std::to_string(world) +
                       ", \"algorithm\": \"" + (hier ? "shm reduce, tcp ring of leaders, shm broadcast" : "tcp ring") + "\"");
  }
  n.store().barrier("done", me, world, 120s);
  n.shutdown(troupe::shutdown_mode::graceful, 10s);
  return 0;
}

/// Waits for the orchestrator's <marks>/cut (the cut's wall ms); 0 when it never came.
long long read_cut(const std::string& marks) {
  long long cut = 0;
  for (int i = 0; i < 500 && !(std::ifstream(marks + "/cut") >> cut); ++i) std::this_thread::sleep_for(10ms);
  return cut;
}

// Rank 1 (host 1) holds a call of rank 0 and creates <marks>/held. The orchestrator cuts host 1
// and writes the cut's time (wall ms) into <marks>/cut. Rank 0 reports the time to peer_lost.
int role_cut(const std::string& marks) {
  troupe::rpc::registry reg;
  std::promise<void> never;
  auto released = never.get_future().share();
  reg.add("hold", [marks, released](int) {
    std::ofstream(marks + "/held") << "1";
    released.wait_for(20s);
    return 1;
  });
  troupe::node n(role_options(), reg);
  const int me = n.info().rank;
  n.store().barrier("up", me, 2, 30s);
  if (me == 0) {
    try {
      troupe::rpc_sync<int>(n, "worker1", "hold", 0, 30s);
      std::fprintf(stderr, "cut: the call was not lost\n");
    } catch (const troupe::error& e) {
      const auto lost = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
      const long long cut = read_cut(marks);
      if (cut > 0 && e.code() == troupe::errc::peer_lost)
        tb::mh::emit("mh_cut_to_peer_lost_ms", static_cast<double>(lost - cut), "ms", "\"limit_ms\": 2000");
      else std::fprintf(stderr, "cut: no figure (cut at %lld): %s\n", cut, e.what());
    }
  } else {
    try {
      n.store().get("never set", 40s);  // serves until host 0 is gone
    } catch (const troupe::error&) {
    }
  }
  n.shutdown(troupe::shutdown_mode::immediate);
  return 0;
}

// 2 hosts x 2 ranks in a hierarchical group. Ranks 0, 1 (host 0) wait in an allreduce that
// ranks 2, 3 (host 1) never issue; those create <marks>/held-<rank>. The orchestrator cuts
// host 1. Each survivor reports the time from the cut to its peer_lost.
int role_cut_allreduce(const std::string& marks) {
  const auto o = role_options();
  troupe::node n(o);
  const int me = n.info().rank;
  {
    troupe::ddp::process_group_options po;
    po.tcp_address = troupe::advertised_address(o.listen_addr, o.master_addr);
    troupe::ddp::hierarchical_group hg(n.store(), me, 4, "mh-bench-cut", po);
    if (me < 2) {
      auto w = hg.allreduce(hg.make_buffer({1 << 16}, troupe::dtype::float32));
      std::ofstream(marks + "/held-" + std::to_string(me)) << "1";
      try {
        w.wait(30s);
        std::fprintf(stderr, "cut: the allreduce was not lost\n");
      } catch (const troupe::error& e) {
        const auto lost = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
        const long long cut = read_cut(marks);
        if (cut > 0 && e.code() == troupe::errc::peer_lost)
          tb::mh::emit("mh_cut_to_peer_lost_allreduce_rank" + std::to_string(me) + "_ms", static_cast<double>(lost - cut), "ms",
                       "\"limit_ms\": 2000");
        else std::fprintf(stderr, "cut: no figure (cut at %lld): %s\n", cut, e.what());
      }
      std::ofstream(marks + "/done-" + std::to_string(me)) << "1";  // the other survivor sees host 1's loss first
      struct stat st{};
      for (int i = 0; i < 2000 && ::stat((marks + "/done-" + std::to_string(1 - me)).c_str(), &st) != 0; ++i)
        std::this_thread::sleep_for(10ms);
    } else {
      std::ofstream(marks + "/held-" + std::to_string(me)) << "1";
      try {
        n.store().get("never set", 40s);  // serves until host 0 is gone
      } catch (const troupe::error&) {
      }
    }
  }
  n.shutdown(troupe::shutdown_mode::immediate);
  return 0;
}

// Runs the ranks of one role: `hosts[i]` is the host of rank i; reports rank 0's figures.
bool run_role(tb::mh::bench_bed& bed, tb::report& rep, const std::string& self, const std::string& role, bool quick,
              const std::vector<int>& hosts, int port, const std::vector<std::string>& extra = {}) {
  std::vector<tb::mh::host_run> runs;
  const int world = static_cast<int>(hosts.size());
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv{self, "--role", role};
    if (quick) argv.push_back("--quick");
    argv.insert(argv.end(), extra.begin(), extra.end());
    runs.push_back(bed.start(hosts[static_cast<std::size_t>(r)], argv, tb::mh::rank_env(r, world, port)));
  }
  bool ok = true;
  for (auto& r : runs) ok = r.wait(quick ? 120s : 300s) && ok;
  if (!tb::mh::collect(rep, runs.front().output()) || !ok)
    std::fprintf(stderr, "multihost_bench: role %s did not report (output of rank 0):\n%s\n", role.c_str(), runs.front().output().c_str());
  return ok;
}

// The time from a cut of host 1 to peer_lost at the caller on host 0.
void run_cut(tb::mh::bench_bed& bed, tb::report& rep, const std::string& self, int port) {
  const std::string marks = bed.marks();
  std::vector<tb::mh::host_run> runs;
  for (int r = 0; r < 2; ++r) runs.push_back(bed.start(r, {self, "--role", "cut", "--marks", marks}, tb::mh::rank_env(r, 2, port)));
  struct stat st{};
  for (int i = 0; i < 6000 && ::stat((marks + "/held").c_str(), &st) != 0; ++i) std::this_thread::sleep_for(10ms);
  bed.cut(1);
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::ofstream(marks + "/cut") << now;
  if (!runs.front().wait(60s)) std::fprintf(stderr, "multihost_bench: the caller did not end within 60 s\n");
  bed.heal(1);
  if (!tb::mh::collect(rep, runs.front().output()))
    std::fprintf(stderr, "multihost_bench: the cut did not report:\n%s\n", runs.front().output().c_str());
  std::system(("rm -rf " + marks).c_str());
}

// The time from a cut of host 1 to peer_lost on both survivors of a hierarchical allreduce.
void run_cut_allreduce(tb::mh::bench_bed& bed, tb::report& rep, const std::string& self, int port) {
  const std::string marks = bed.marks();
  std::vector<tb::mh::host_run> runs;
  for (int r = 0; r < 4; ++r)
    runs.push_back(bed.start(r / 2, {self, "--role", "cut-allreduce", "--marks", marks}, tb::mh::rank_env(r, 4, port)));
  struct stat st{};
  for (const char* m : {"/held-0", "/held-1", "/held-2", "/held-3"})
    for (int i = 0; i < 6000 && ::stat((marks + m).c_str(), &st) != 0; ++i) std::this_thread::sleep_for(10ms);
  bed.cut(1);
  const auto now = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::ofstream(marks + "/cut") << now;
  for (int r = 0; r < 2; ++r) {
    auto& run = runs[static_cast<std::size_t>(r)];
    if (!run.wait(60s)) std::fprintf(stderr, "multihost_bench: survivor %d did not end within 60 s\n", r);
    if (!tb::mh::collect(rep, run.output()))
      std::fprintf(stderr, "multihost_bench: survivor %d of the allreduce cut did not report:\n%s\n", r, run.output().c_str());
  }
  bed.heal(1);
  for (int r = 2; r < 4; ++r) runs[static_cast<std::size_t>(r)].wait(60s);
  std::system(("rm -rf " + marks).c_str());
}

int multihost_orchestrate(bool quick, const std::string& self) {
  tb::mh::bench_bed bed;
  if (!bed.up()) {
    std::printf("multihost_bench: skipped: network namespaces cannot be created here (needs root, iproute2, nftables)\n");
    return 0;
  }
  tb::report rep("multihost");
  {
    auto server = bed.start(1, {self, "--role", "tcp-server"}, {});
    std::vector<std::string> client{self, "--role", "tcp-client"};
    if (quick) client.push_back("--quick");
    auto c = bed.start(0, client, {});
    c.wait(120s);
    server.wait(10s);
    tb::mh::collect(rep, c.output());
  }
  run_role(bed, rep, self, "rpc", quick, {0, 1}, 29610);
  {
    const troupe::test::tls_test_certs certs;  // the cost of TLS: the same role with TLS on
    run_role(bed, rep, self, "rpc", quick, {0, 1}, 29670, {"--tls-dir", certs.path("")});
  }
  run_role(bed, rep, self, "allreduce", quick, {0, 1}, 29620);
  run_role(bed, rep, self, "allreduce", quick, {0, 0, 1, 1}, 29630);
  run_role(bed, rep, self, "allreduce-hier", quick, {0, 0, 1, 1}, 29650);
  run_cut(bed, rep, self, 29640);
  run_cut_allreduce(bed, rep, self, 29660);
  rep.print_table();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  tb::check_args(argc, argv, "multihost_bench",
                 "Figures between two network-namespace hosts of the test bed (root; skipped without namespaces).",
                 {{"--role", "NAME", "internal: run one role on a namespace host"},
                  {"--marks", "DIR", "internal: the cut role's marker directory"},
                  {"--tls-dir", "DIR", "internal: the rpc role's TLS certificates (DIR/rank.crt, rank.key, ca.crt)"}});
  const bool quick = tb::quick_mode(argc, argv);
  std::string role, marks, tls_dir;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--role") role = argv[i + 1];
    if (std::string(argv[i]) == "--marks") marks = argv[i + 1];
    if (std::string(argv[i]) == "--tls-dir") tls_dir = argv[i + 1];
  }
  try {
    if (role == "tcp-server") return tb::mh::tcp_server(std::stoi(port_env) + 1);
    if (role == "tcp-client")
      return tb::mh::tcp_client("10.77.0.2", std::stoi(port_env) + 1, quick ? 2000 : 20000, (quick ? 256ull : 2048ull) << 20,
                                quick ? 2 : 10);
    if (role == "rpc") return role_rpc(quick, tls_dir);
    if (role == "allreduce") return role_allreduce(quick, false);
    if (role == "allreduce-hier") return role_allreduce(quick, true);
    if (role == "cut") return role_cut(marks);
    if (role == "cut-allreduce") return role_cut_allreduce(marks);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "multihost_bench --role %s: %s\n", role.c_str(), e.what());
    return 1;
  }
  char buf[4096];
  const auto n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return multihost_orchestrate(quick, std::string(buf, static_cast<std::size_t>(std::max<ssize_t>(n, 0))));
}
