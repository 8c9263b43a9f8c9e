// dist_autograd_bench: forward + backward through RPC hops against the same ops done locally in the
// same run (BENCH.md). Three processes on loopback: this one (worker0, the driver) and two forked
// workers. One hop: x (256x256, requires grad) -> worker1: x @ W1 -> worker0: sum. Pipeline:
// x -> worker1: h1 = x @ W1 -> worker2: h2 = h1 @ W2 -> worker0: sum(h2 @ W0). Every iteration is a
// full context (create, forward, distributed backward, release on every worker). Limits: the
// local fwd+bwd of the same ops, and the rpc echo of one 256x256 tensor (each hop moves one tensor
// each way forward and one each way backward: about two echoes).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <functional>

#include "bench_util.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/dist_autograd/container.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace std::chrono_literals;
namespace tb = troupe::bench;
namespace da = troupe::dist_autograd;
using troupe::tensor;

namespace {

constexpr std::int64_t dim = 256;

troupe::node_options options(int rank, std::uint16_t port) {
  troupe::node_options o;
  o.rank = rank;
  o.world_size = 3;
  o.master_port = port;
  o.job_token = "bench";
  o.default_timeout = 30s;
  return o;
}

tensor weight(int rank) {
  troupe::generator g(static_cast<std::uint64_t>(10 + rank));
  tensor w = troupe::randn({dim, dim}, g, {}, 0.0, 0.05);
  troupe::set_requires_grad(w);
  return w;
}

tensor input() {
  troupe::generator g(1);
  tensor x = troupe::randn({dim, dim}, g);
  troupe::set_requires_grad(x);
  return x;
}

// worker1 / worker2: "mm"(x) = x @ W_rank, "echo"(t) = t.
void serve(int rank, std::uint16_t port) {
  troupe::node n(options(rank, port));
  {
    da::container dist(n);
    tensor w = weight(rank);
    n.functions().add("mm", [&w](tensor x) { return troupe::matmul(x, w); });
    n.functions().add("echo", [](tensor t) { return t; });
    n.store().set("ready/" + std::to_string(rank), "1");
    n.store().get("done", 600s);
  }
  n.shutdown(troupe::shutdown_mode::immediate);
}

/// Runs one distributed iteration: `forward` builds the loss inside a fresh context; returns the
/// gradient of x on this worker (for the correctness check).
template <class F>
tensor dist_iteration(da::container& dist, const tensor& x, F forward) {
  da::context ctx(dist);
  dist.backward(ctx.id(), {forward()});
  return dist.get_gradients(ctx.id()).at(x);
}

tensor local_grad(tensor x, const std::function<tensor()>& forward) {  // x: a handle on the leaf
  troupe::zero_grad(x);
  troupe::backward(forward());
  return troupe::grad(x);
}

void one_hop(troupe::node& n, da::container& dist, tb::report& rep, int iters) {
  const tensor x = input(), w1 = weight(1);
  auto remote = [&] { return troupe::sum(troupe::rpc_sync<tensor>(n, "worker1", "mm", x)); };
  auto local = [&] { return troupe::sum(troupe::matmul(x, w1)); };
  const bool same = troupe::equal(dist_iteration(dist, x, remote), local_grad(x, local));
  const auto r = tb::summarize(tb::time_runs(iters / 10, iters, [&] { dist_iteration(dist, x, remote); }));
  const auto l = tb::summarize(tb::time_runs(iters / 10, iters, [&] { local_grad(x, local); }));
  const std::string p = "\"iters\": " + std::to_string(iters) + ", \"matmul\": \"256x256\", \"grad_equal\": " +
                        (same ? "true" : "false");
  rep.add("one_hop_fwd_bwd_median_us", r.median * 1e6, "us", p);
  rep.add("one_hop_fwd_bwd_p99_us", r.p99 * 1e6, "us", p);
  rep.add("limit_local_fwd_bwd_median_us", l.median * 1e6, "us", p);
  rep.add("one_hop_overhead_per_hop_us", (r.median - l.median) * 1e6, "us", p);
  if (!same) std::fprintf(stderr, "dist_autograd_bench: one-hop gradient differs from the local one\n");
}

void pipeline(troupe::node& n, da::container& dist, tb::report& rep, int iters) {
  const tensor x = input(), w0 = weight(0), w1 = weight(1), w2 = weight(2);
  auto remote = [&] {
    tensor h1 = troupe::rpc_sync<tensor>(n, "worker1", "mm", x);
    tensor h2 = troupe::rpc_sync<tensor>(n, "worker2", "mm", h1);
    return troupe::sum(troupe::matmul(h2, w0));
  };
  auto local = [&] { return troupe::sum(troupe::matmul(troupe::matmul(troupe::matmul(x, w1), w2), w0)); };
  const bool same = troupe::equal(dist_iteration(dist, x, remote), local_grad(x, local));
  const auto r = tb::summarize(tb::time_runs(iters / 10, iters, [&] { dist_iteration(dist, x, remote); }));
  const auto l = tb::summarize(tb::time_runs(iters / 10, iters, [&] { local_grad(x, local); }));
  const std::string p = "\"iters\": " + std::to_string(iters) + ", \"stages\": 3, \"hops\": 2, \"grad_equal\": " +
                        (same ? "true" : "false");
  rep.add("pipeline_3stage_fwd_bwd_median_us", r.median * 1e6, "us", p);
  rep.add("pipeline_3stage_fwd_bwd_p99_us", r.p99 * 1e6, "us", p);
  rep.add("limit_local_pipeline_fwd_bwd_median_us", l.median * 1e6, "us", p);
  rep.add("pipeline_overhead_per_hop_us", (r.median - l.median) * 1e6 / 2, "us", p);
  if (!same) std::fprintf(stderr, "dist_autograd_bench: pipeline gradient differs from the local one\n");
}

void echo_limit(troupe::node& n, tb::report& rep, int iters) {
  troupe::generator g(3);
  const tensor t = troupe::randn({dim, dim}, g);
  const auto e = tb::summarize(tb::time_runs(iters / 10, iters, [&] { troupe::rpc_sync<tensor>(n, "worker1", "echo", t); }));
  rep.add("limit_rpc_echo_256x256_median_us", e.median * 1e6, "us", "\"iters\": " + std::to_string(iters));
}

std::uint16_t free_port() {
  const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::getsockname(probe, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(probe);
  return ntohs(addr.sin_port);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = tb::quick_mode(argc, argv);
  const int iters = quick ? 50 : 1000;
  tb::report rep("dist_autograd");
  const std::uint16_t port = free_port();  // chosen before the fork (spawn precedes any actor system)
  auto children = troupe::spawn(2, [port](int i) { serve(i + 1, port); });
  try {
    troupe::node n(options(0, port));
    {
      da::container dist(n);
      n.store().wait({"ready/1", "ready/2"}, 30s);
      echo_limit(n, rep, iters);
      one_hop(n, dist, rep, iters);
      pipeline(n, dist, rep, iters);
      n.store().set("done", "1");
    }
    n.shutdown(troupe::shutdown_mode::immediate);
    if (!children.join(30s)) throw troupe::error(troupe::errc::timeout, "workers still running after 30 s");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist_autograd_bench failed: %s\n", e.what());
    return 1;
  }
  rep.print_table();
  return 0;
}
