// parameter_server: a parameter server (worker0) and N trainers (worker1..N) in forked processes.
// The server owns the weights of a linear regression as dist_autograd parameters. It serves the
// forward pass as a method of an rref<server>. Each trainer holds rrefs to the server and to
// the weights. Inside a distributed autograd context it runs forward through the rref method,
// the distributed backward, and DistributedOptimizer.step. It prints its loss, which must fall.
//
//   parameter_server [--trainers N] [--steps S] [--lr LR] [--help]
#include <poll.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <boost/serialization/string.hpp>

#include "troupe/actors/node.hpp"
#include "troupe/actors/rref/rref.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/autograd/nn/loss.hpp"
#include "troupe/dist_autograd/container.hpp"
#include "troupe/dist_autograd/optimizer.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"
#include "troupe/tensors/linalg.hpp"

using namespace troupe;
using namespace std::chrono_literals;
namespace da = troupe::dist_autograd;

namespace {

struct options {
  int trainers = 2;
  int steps = 60;
  double lr = 0.05;
};

constexpr const char* usage =
    "usage: parameter_server [--trainers N] [--steps S] [--lr LR]\n"
    "A parameter server (worker0) and N trainers in forked processes, with distributed autograd.\n"
    "  --trainers N   trainer processes, 1 to 8 (default 2)\n"
    "  --steps S      steps per trainer, >= 10 (default 60)\n"
    "  --lr LR        SGD learning rate, > 0 (default 0.05)\n"
    "  --help         this text\n";

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--help" || k == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    }
    if (i + 1 >= argc) throw error(errc::bad_argument, "parameter_server: unknown option or missing value: " + k);
    const char* v = argv[++i];
    if (k == "--trainers") o.trainers = std::atoi(v);
    else if (k == "--steps") o.steps = std::atoi(v);
    else if (k == "--lr") o.lr = std::atof(v);
    else throw error(errc::bad_argument, "parameter_server: unknown option " + k);
  }
  if (o.trainers < 1 || o.trainers > 8 || o.steps < 10 || !(o.lr > 0))
    throw error(errc::bad_argument, "parameter_server: need 1 <= --trainers <= 8, --steps >= 10, --lr > 0");
  return o;
}

/// The object behind the server's rref. Its weights live in the dist_autograd container
/// (make_parameter), so their autograd identity survives across calls.
struct server {
  std::string name;
  template <class Ar> void serialize(Ar& ar, unsigned) { ar & name; }
};

/// The pipe that hands worker0's port to the trainers (made before the fork).
struct port_pipe {
  std::array<int, 2> fd{-1, -1};
  port_pipe() {
    if (::pipe(fd.data()) != 0) throw error(errc::io_error, "parameter_server: pipe() failed");
  }
  ~port_pipe() {
    ::close(fd[0]);
    ::close(fd[1]);
  }
  void send(std::uint16_t port, int n) {
    for (int i = 0; i < n; ++i)
      if (::write(fd[1], &port, sizeof port) != sizeof port) throw error(errc::io_error, "parameter_server: pipe write");
  }
  std::uint16_t receive() {
    pollfd p{fd[0], POLLIN, 0};
    std::uint16_t port = 0;
    if (::poll(&p, 1, 20000) != 1 || ::read(fd[0], &port, sizeof port) != sizeof port)
      throw error(errc::timeout, "parameter_server: no port from worker0 within 20 s");
    return port;
  }
};

node_options node_opts(int rank, const options& o, std::uint16_t port) {
  node_options no;
  no.rank = rank;
  no.world_size = o.trainers + 1;
  no.master_port = port;
  if (const char* t = std::getenv("TROUPE_JOB_TOKEN")) no.job_token = t;  // random per run: spawn made it for its children
  da::add_message_types(no);  // the container's actor messages
  return no;
}

void run_server(const options& o, port_pipe& pipe) {
  node n(node_opts(0, o, 0));
  pipe.send(n.port(), o.trainers);
  {
    rref_context rc(n);
    da::container dist(n);
    generator g(1);
    rref<tensor> w = da::make_parameter(rc, dist, randn({10, 1}, g, {}, 0.0, 0.1));
    rref<server> ps = make_rref(rc, server{"ps"});
    // Trainers step concurrently (asynchronous SGD): the forward works on a differentiable snapshot
    // (clone), so another trainer's in-place step between this forward and its backward is fine.
    add_method<server>(rc, "forward", [&](server&, tensor x) { return matmul(x, da::local_parameter(dist, w).clone()); });
    add_function(rc, "server", [&ps] { return ps.share(); });
    add_function(rc, "weight", [&w] { return w.share(); });
    n.store().set("ready", "1");
    std::vector<std::string> done;
    for (int r = 1; r <= o.trainers; ++r) done.push_back("done/" + std::to_string(r));
    n.store().wait(done, 5min);
  }
  n.shutdown(shutdown_mode::graceful);
}

void run_trainer(int rank, const options& o, port_pipe& pipe) {
  node n(node_opts(rank, o, pipe.receive()));
  {
    rref_context rc(n);
    da::container dist(n);
    n.store().wait({"ready"}, 20s);
    auto ps = rpc_sync<rref<server>>(rc, "worker0", "server");
    std::vector<rref<tensor>> params;
    params.push_back(rpc_sync<rref<tensor>>(rc, "worker0", "weight"));
    da::distributed_optimizer opt(dist, da::optimizer_spec::make_sgd({.lr = o.lr}), params);
    generator truth(42), data(static_cast<std::uint64_t>(100 + rank));
    const tensor w_true = randn({10, 1}, truth);
    double first = 0, last = 0;
    for (int step = 1; step <= o.steps; ++step) {
      const tensor x = randn({32, 10}, data);
      const tensor y = matmul(x, w_true);
      da::context ctx(dist);
      const tensor loss = nn::mse_loss(ps.rpc_sync<tensor>("forward", x), y);
      dist.backward(ctx.id(), {loss});
      opt.step(ctx.id());
      last = loss.item();
      if (step == 1) first = last;
      if (step == 1 || step % 10 == 0) std::printf("trainer %d  step %3d  loss %.5f\n", rank, step, last);
      std::fflush(stdout);
    }
    if (!(last < 0.5 * first))
      throw error(errc::invalid_state, "parameter_server: trainer " + std::to_string(rank) + "'s loss did not fall (" +
                                           std::to_string(first) + " -> " + std::to_string(last) + ")");
    n.store().set("done/" + std::to_string(rank), "1");
  }
  n.shutdown(shutdown_mode::graceful);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    o = parse(argc, argv);
  } catch (const error& e) {
    std::fprintf(stderr, "%s\n%s", e.what(), usage);
    return 2;
  }
  try {
    port_pipe pipe;
    std::printf("parameter_server: 1 server + %d trainers, %d steps each, sgd lr %g\n", o.trainers, o.steps, o.lr);
    std::fflush(stdout);
    auto job = spawn(o.trainers + 1, [&](int rank) { rank == 0 ? run_server(o, pipe) : run_trainer(rank, o, pipe); });
    if (!job.join(5min)) throw error(errc::timeout, "parameter_server: still running after 5 minutes");
    std::printf("parameter_server: every trainer's loss fell\n");
  } catch (const error& e) {
    std::fprintf(stderr, "parameter_server failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
