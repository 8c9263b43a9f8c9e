// DistributedDataParallel training, the DDP design note's example made real: every rank builds
// Linear(10, 10) (or an MLP with --mlp), wraps it in distributed_data_parallel, and trains it with
// MSELoss and SGD(lr=0.001) on a learnable synthetic regression; the ranks are forked with spawn.
//
//   ddp_train [--world-size N] [--steps S] [--batch B] [--mlp]
//
// Rank 0 prints a progress line (step, loss, steps/s) and the final loss. Exits 1 when the loss
// did not fall on a held-out batch or a rank failed, 2 on bad arguments.
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "troupe/actors/node.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/autograd/nn/activation.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/nn/loss.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/ddp/distributed_data_parallel.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/factories.hpp"

using namespace troupe;

namespace {

struct options {
  int world_size = 2;
  int steps = 500;
  int batch = 20;
  bool mlp = false;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const bool has_value = i + 1 < argc;
    if (a == "--world-size" && has_value) o.world_size = std::stoi(argv[++i]);
    else if (a == "--steps" && has_value) o.steps = std::stoi(argv[++i]);
    else if (a == "--batch" && has_value) o.batch = std::stoi(argv[++i]);
    else if (a == "--mlp") o.mlp = true;
    else throw error(errc::bad_argument, "ddp_train: unknown or incomplete argument '" + a + "'");
  }
  if (o.world_size < 1 || o.world_size > 16 || o.steps < 20 || o.batch < 1)
    throw error(errc::bad_argument, "ddp_train: need 1 <= --world-size <= 16, --steps >= 20, --batch >= 1");
  return o;
}

/// Hands rank 0's ephemeral store port to the other ranks (made before the fork).
class port_pipe {
 public:
  port_pipe() {
    if (::pipe(fds_) != 0) throw error(errc::io_error, "ddp_train: pipe() failed");
  }
  ~port_pipe() {
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  void publish(std::uint16_t port, int readers) {
    for (int i = 0; i < readers; ++i)
      if (::write(fds_[1], &port, sizeof(port)) != sizeof(port)) throw error(errc::io_error, "ddp_train: pipe write");
  }
  std::uint16_t read() {
    pollfd p{fds_[0], POLLIN, 0};
    if (::poll(&p, 1, 20000) != 1) throw error(errc::timeout, "ddp_train: no store port from rank 0 within 20 s");
    std::uint16_t port = 0;
    if (::read(fds_[0], &port, sizeof(port)) != sizeof(port)) throw error(errc::io_error, "ddp_train: pipe read");
    return port;
  }

 private:
  int fds_[2] = {-1, -1};
};

std::shared_ptr<nn::unary_module> build_model(bool mlp, int rank) {
  generator g(static_cast<std::uint64_t>(100 + rank));  // differs per rank: DDP broadcasts rank 0's
  if (!mlp) return std::make_shared<nn::linear>(10, 10, g);
  auto m = std::make_shared<nn::sequential>();
  m->push_back(std::make_shared<nn::linear>(10, 64, g));
  m->push_back(std::make_shared<nn::tanh>());
  m->push_back(std::make_shared<nn::linear>(64, 10, g));
  return m;
}

void train(int rank, const options& o, port_pipe& pipe) {
  node_options no;
  no.rank = rank;
  no.world_size = o.world_size;
  if (const char* t = std::getenv("TROUPE_JOB_TOKEN")) no.job_token = t;  // random per run: spawn made it for its children
  if (rank != 0) no.master_port = pipe.read();
  node n(no);
  if (rank == 0) pipe.publish(n.port(), o.world_size - 1);
  {
    ddp::process_group pg(n.store(), rank, o.world_size, "ddp_train");
    ddp::distributed_data_parallel model(build_model(o.mlp, rank), pg);
    optim::sgd opt(model.parameters(), {.lr = 0.001});
    generator truth(42);  // the same target function on every rank
    const tensor w_true = randn({10, 10}, truth), b_true = randn({10}, truth);
    generator data(static_cast<std::uint64_t>(7 + rank));  // each rank its own shard of data
    // A held-out batch, the same on every rank: the learning check compares the model's loss on
    // it before and after training (deterministic, unlike a window of noisy training losses).
    generator held_out(4242);
    const tensor x_eval = randn({512, 10}, held_out);
    const tensor y_eval = x_eval.matmul(w_true.t()) + b_true;
    auto eval_loss = [&] {
      no_grad_guard ng;  // parameters are identical on all ranks: evaluate the wrapped module
      return nn::mse_loss(model.module()(x_eval), y_eval).item();
    };
    const double before = eval_loss();
    const auto t0 = std::chrono::steady_clock::now();
    for (int step = 1; step <= o.steps; ++step) {
      const tensor x = randn({o.batch, 10}, data);
      const tensor y = x.matmul(w_true.t()) + b_true + randn({o.batch, 10}, data, {}, 0.0, 0.01);
      opt.zero_grad();
      const tensor loss = nn::mse_loss(model(x), y);
      backward(loss);
      opt.step();
      const double l = loss.item();
      if (rank == 0 && (step % 50 == 0 || step == 1)) {
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("step %5d  loss %.5f  %.1f steps/s\n", step, l, step / secs);
        std::fflush(stdout);
      }
    }
    const double after = eval_loss();
    if (rank == 0) {
      std::printf("final held-out loss %.5f (before training %.5f), %d ranks, %d steps\n", after, before,
                  o.world_size, o.steps);
      std::fflush(stdout);
    }
    if (o.steps > 0 && !(after < before))
      throw error(errc::invalid_state, "ddp_train: the held-out loss did not fall (" + std::to_string(before) + " -> " +
                                           std::to_string(after) + ")");
  }
  n.shutdown(shutdown_mode::graceful);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    o = parse(argc, argv);
  } catch (const error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  try {
    port_pipe pipe;
    std::printf("ddp_train: %d ranks, %s, batch %d per rank, %d steps\n", o.world_size,
                o.mlp ? "MLP 10-64-10" : "Linear(10, 10)", o.batch, o.steps);
    std::fflush(stdout);
    auto ctx = spawn(o.world_size, [&](int rank) { train(rank, o, pipe); });
    if (!ctx.join(std::chrono::minutes(5))) throw error(errc::timeout, "ddp_train: ranks still running after 5 minutes");
  } catch (const error& e) {
    std::fprintf(stderr, "ddp_train failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
