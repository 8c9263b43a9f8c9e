// dist_autograd_bench: forward + backward through RPC hops against the same ops done locally in the
// same run (BENCH.md). Three processes on loopback: this one (worker0, the driver) and two forked
// workers. One hop: x (256x256, requires grad) -> worker1: x @ W1 -> worker0: sum. Pipeline:
// x -> worker1: h1 = x @ W1 -> worker2: h2 = h1 @ W2 -> worker0: sum(h2 @ W0). Every iteration is a
// full context (create, forward, distributed backward, release on every worker). Limits: the
// local fwd+bwd of the same ops, and the rpc echo of one 256x256 tensor. Each hop moves one
// tensor each way forward and one each way backward: about two echoes.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <vector>

#include "bench_node.hpp"
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
constexpr std::int64_t small_dim = 4;  // the protocol's own cost: no bulk transfer, no real matmul

troupe::node_options options(int rank, std::uint16_t port) {
  auto o = troupe::bench::bench_node_options(rank, 3, port);
  da::add_message_types(o);
  return o;
}

tensor weight(int rank, std::int64_t d = dim) {
  troupe::generator g(static_cast<std::uint64_t>(10 + rank));
  tensor w = troupe::randn({d, d}, g, {}, 0.0, 0.05);
  troupe::set_requires_grad(w);
  return w;
}

tensor input(std::int64_t d = dim) {
  troupe::generator g(1);
  tensor x = troupe::randn({d, d}, g);
  troupe::set_requires_grad(x);
  return x;
}

// worker1 / worker2: "mm"(x) = x @ W_rank, "mm_small"(x) = x @ w_rank (4x4), "echo"(t) = t.
void serve(int rank, std::uint16_t port) {
  troupe::node n(options(rank, port));
  {
    da::container dist(n);
    tensor w = weight(rank), w_small = weight(rank, small_dim);
    n.functions().add("mm", [&w](tensor x) { return troupe::matmul(x, w); });
    n.functions().add("mm_small", [&w_small](tensor x) { return troupe::matmul(x, w_small); });
    n.functions().add("echo", [](tensor t) { return t; });
    n.store().set("ready/" + std::to_string(rank), "1");
    n.store().get("done", 600s);
  }
  n.shutdown(troupe::shutdown_mode::immediate);
}

/// Seconds spent in each phase of one distributed iteration.
struct phases {
  double forward = 0, backward = 0, release = 0;
};

/// Runs one distributed iteration: `forward` builds the loss inside a fresh context; returns the
/// gradient of x on this worker (for the correctness check); `t` gets the phases' times.
template <class F>
tensor dist_iteration(da::container& dist, const tensor& x, F forward, phases& t) {
  tensor g;
  auto t0 = tb::clock::now();
  {
    da::context ctx(dist);
    tensor loss = forward();
    t.forward = tb::seconds_since(t0);
    t0 = tb::clock::now();
    dist.backward(ctx.id(), {loss});
    g = dist.get_gradients(ctx.id()).at(x);
    t.backward = tb::seconds_since(t0);
    t0 = tb::clock::now();
  }
  t.release = tb::seconds_since(t0);
  return g;
}

tensor local_grad(tensor x, const std::function<tensor()>& forward) {  // x: a handle on the leaf
  troupe::zero_grad(x);
  troupe::backward(forward());
  return troupe::grad(x);
}

/// Times `remote` (a distributed iteration) against `local` (the same ops here), after checking
/// that both give x the same gradient; adds the median/p99, the local limit and the overhead/hop.
void measure(da::container& dist, tb::report& rep, int iters, const tensor& x, const std::function<tensor()>& remote,
             const std::function<tensor()>& local, const std::string& name, const std::string& limit, int hops,
             const std::string& what) {
  phases ph;
  const bool same = troupe::equal(dist_iteration(dist, x, remote, ph), local_grad(x, local));
  // Alternate distributed and local iterations, so both see the same load of the (shared) machine.
  std::vector<double> remote_s, local_s, fwd_s, bwd_s, rel_s;
  for (int i = 0; i < iters + iters / 10; ++i) {
    auto t0 = tb::clock::now();
    dist_iteration(dist, x, remote, ph);
    const double rs = tb::seconds_since(t0);
    t0 = tb::clock::now();
    local_grad(x, local);
    const double ls = tb::seconds_since(t0);
    if (i < iters / 10) continue;  // warm-up
    remote_s.push_back(rs);
    local_s.push_back(ls);
    fwd_s.push_back(ph.forward);
    bwd_s.push_back(ph.backward);
    rel_s.push_back(ph.release);
  }
  const auto r = tb::summarize(remote_s), l = tb::summarize(local_s);
  const std::string p = "\"iters\": " + std::to_string(iters) + ", \"interleaved\": true, " + what + ", \"hops\": " + std::to_string(hops) +
                        ", \"grad_equal\": " + (same ? "true" : "false");
  rep.add(name + "_fwd_bwd_median_us", r.median * 1e6, "us", p);
  rep.add(name + "_fwd_bwd_p99_us", r.p99 * 1e6, "us", p);
  rep.add(limit, l.median * 1e6, "us", p);
  rep.add(name + "_overhead_per_hop_us", (r.median - l.median) * 1e6 / hops, "us", p);
  // Where the distributed iteration's time goes: context + forward, backward, release.
  rep.add(name + "_forward_median_us", tb::summarize(fwd_s).median * 1e6, "us", p);
  rep.add(name + "_backward_median_us", tb::summarize(bwd_s).median * 1e6, "us", p);
  rep.add(name + "_release_median_us", tb::summarize(rel_s).median * 1e6, "us", p);
  if (!same) std::fprintf(stderr, "dist_autograd_bench: %s gradient differs from the local one\n", name.c_str());
}

void one_hop(troupe::node& n, da::container& dist, tb::report& rep, int iters) {
  const tensor x = input(), w1 = weight(1);
  measure(
      dist, rep, iters, x, [&] { return troupe::sum(troupe::rpc_sync<tensor>(n, "worker1", "mm", x)); },
      [&] { return troupe::sum(troupe::matmul(x, w1)); }, "one_hop", "limit_local_fwd_bwd_median_us", 1,
      "\"matmul\": \"256x256\"");
}

/// The same hop with 4x4 tensors: what the protocol itself costs (meta, send/recv records, two
/// PropagateGradients, the context actors, the release), without bulk transfers or compute.
void one_hop_small(troupe::node& n, da::container& dist, tb::report& rep, int iters) {
  const tensor x = input(small_dim), w1 = weight(1, small_dim);
  measure(
      dist, rep, iters, x, [&] { return troupe::sum(troupe::rpc_sync<tensor>(n, "worker1", "mm_small", x)); },
      [&] { return troupe::sum(troupe::matmul(x, w1)); }, "one_hop_4x4", "limit_local_4x4_fwd_bwd_median_us", 1,
      "\"matmul\": \"4x4\"");
}

void pipeline(troupe::node& n, da::container& dist, tb::report& rep, int iters) {
  const tensor x = input(), w0 = weight(0), w1 = weight(1), w2 = weight(2);
  auto remote = [&] {
    tensor h1 = troupe::rpc_sync<tensor>(n, "worker1", "mm", x);
    tensor h2 = troupe::rpc_sync<tensor>(n, "worker2", "mm", h1);
    return troupe::sum(troupe::matmul(h2, w0));
  };
  auto local = [&] { return troupe::sum(troupe::matmul(troupe::matmul(troupe::matmul(x, w1), w2), w0)); };
  measure(dist, rep, iters, x, remote, local, "pipeline_3stage", "limit_local_pipeline_fwd_bwd_median_us", 2,
          "\"stages\": 3");
}

void echo_limit(troupe::node& n, tb::report& rep, int iters) {
  troupe::generator g(3);
  const tensor t = troupe::randn({dim, dim}, g);
  const auto e = tb::summarize(tb::time_runs(iters / 10, iters, [&] { troupe::rpc_sync<tensor>(n, "worker1", "echo", t); }));
  rep.add("limit_rpc_echo_256x256_median_us", e.median * 1e6, "us", "\"iters\": " + std::to_string(iters));
}


/// worker0: measures and prints. It is a forked child like the workers. OpenBLAS's thread pool
/// does not survive fork, so every process that runs a matmul here is a child, the local limit
/// included.
void drive(std::uint16_t port, int iters) {
  tb::report rep("dist_autograd");
  troupe::node n(options(0, port));
  {
    da::container dist(n);
    n.store().wait({"ready/1", "ready/2"}, 30s);
    echo_limit(n, rep, iters);
    one_hop_small(n, dist, rep, iters);
    one_hop(n, dist, rep, iters);
    pipeline(n, dist, rep, iters);
    n.store().set("done", "1");
  }
  n.shutdown(troupe::shutdown_mode::immediate);
  rep.print_table();
}

}  // namespace

int main(int argc, char** argv) {
  tb::check_args(argc, argv, "dist_autograd_bench",
                 "Forward and backward through RPC hops against the same ops done locally.");
  const int iters = tb::quick_mode(argc, argv) ? 50 : 1000;
  const std::uint16_t port = troupe::bench::free_loopback_port();
  try {
    auto job = troupe::spawn(3, [port, iters](int rank) { rank == 0 ? drive(port, iters) : serve(rank, port); });
    if (!job.join(10min)) throw troupe::error(troupe::errc::timeout, "dist_autograd_bench: still running after 10 min");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist_autograd_bench failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
