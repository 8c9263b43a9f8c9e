// ddp_train: data-parallel training that visibly learns (`make demo`).
//
// Each rank is a worker process. Every rank builds the same MLP,
//
//   Sequential(Linear(2, 64), Tanh(), Linear(64, 64), Tanh(), Linear(64, 3))
//
// wraps it in distributed_data_parallel and trains it with Adam on its own shard of a synthetic
// task: which of three spiral arms a 2-D point lies on. DDP averages the gradients, so every
// rank holds the same weights after each step. Rank 0 measures the accuracy on held-out points,
// prints progress, and writes to --out:
//
//   loss.csv            step, training loss, held-out loss and accuracy
//   loss.svg            the same as a plot (open it in a browser)
//   model.safetensors   the weights, named and shaped as PyTorch's nn.Sequential above
//                       ("0.weight" [64, 2], "0.bias" [64], "2.weight", ..., "4.bias" [3])
//
// The ranks are forked here (troupe::spawn) unless the program runs under troupe-run, which sets
// RANK and WORLD_SIZE:  troupe-run --nproc-per-node 2 -- ddp_train
//
// Under a fault plan (TROUPE_FAULTS=plan.txt, docs/faults.md) its kill, pause and delay events at
// the DDP points (forward, backward, allreduce, ...) and its collective payload rules act on the
// training's process group.
//
// Exit codes: 0 when the held-out accuracy reaches --target-accuracy, 1 when it does not or a
// rank fails, 2 on bad arguments.
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <numbers>
#include <random>
#include <string>

#include "loss_curve.hpp"
#include "troupe/actors.hpp"
#include "troupe/autograd.hpp"
#include "troupe/ddp.hpp"
#include "troupe/ddp/node_faults.hpp"

using namespace troupe;

namespace {

constexpr const char* usage =
    "usage: ddp_train [options]\n"
    "Trains an MLP on 2 ranks with DistributedDataParallel; writes loss.csv, loss.svg, model.safetensors.\n"
    "  --world-size N        ranks to fork (default 2; ignored under troupe-run)\n"
    "  --steps S             training steps (default 1500)\n"
    "  --batch B             examples per rank and step (default 64)\n"
    "  --lr LR               Adam learning rate (default 0.01)\n"
    "  --eval-every E        steps between held-out evaluations (default 50)\n"
    "  --target-accuracy A   held-out accuracy to reach, in [0, 1] (default 0.95)\n"
    "  --out DIR             where the outputs go (default ddp_train_out)\n"
    "  --seed S              seed of the data and the weights (default 1)\n"
    "  --help                this text\n"
    "TROUPE_FAULTS=PLAN runs every rank under a fault plan (docs/faults.md): its events at the DDP\n"
    "points (forward, backward, allreduce, ...) and its collective payload rules act on the training.\n";

struct options {
  int world_size = 2;
  int steps = 1500;
  int batch = 64;
  double lr = 0.01;
  int eval_every = 50;
  double target = 0.95;
  std::string out = "ddp_train_out";
  std::uint64_t seed = 1;
};

// The number in `text`, or bad_argument naming the flag.
double number(const std::string& flag, const std::string& text) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size()) throw error(errc::bad_argument, flag + " needs a number, got '" + text + "'");
  return v;
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) throw error(errc::bad_argument, "missing value after " + a);
      return std::string(argv[++i]);
    };
    if (a == "--help" || a == "-h") {
      std::fputs(usage, stdout);
      std::exit(0);
    }
    if (a == "--world-size") o.world_size = static_cast<int>(number(a, value()));
    else if (a == "--steps") o.steps = static_cast<int>(number(a, value()));
    else if (a == "--batch") o.batch = static_cast<int>(number(a, value()));
    else if (a == "--lr") o.lr = number(a, value());
    else if (a == "--eval-every") o.eval_every = static_cast<int>(number(a, value()));
    else if (a == "--target-accuracy") o.target = number(a, value());
    else if (a == "--out") o.out = value();
    else if (a == "--seed") o.seed = static_cast<std::uint64_t>(number(a, value()));
    else throw error(errc::bad_argument, "unknown option " + a);
  }
  if (o.world_size < 1 || o.world_size > 16 || o.steps < 1 || o.batch < 1 || !(o.lr > 0) || o.eval_every < 1 ||
      !(o.target >= 0 && o.target <= 1))
    throw error(errc::bad_argument,
                "need 1 <= --world-size <= 16, --steps >= 1, --batch >= 1, --lr > 0, --eval-every >= 1, "
                "0 <= --target-accuracy <= 1");
  return o;
}

struct dataset {
  tensor x;  // [n, 2] float32
  tensor y;  // [n] int64, the arm: 0, 1 or 2
};

// Three spiral arms of 1.5 turns, 120 degrees apart, with a little Gaussian noise.
dataset spirals(std::int64_t n, generator& gen) {
  const tensor u = rand({n}, gen), c = randint(0, 3, {n}, gen), noise = randn({n, 2}, gen, {}, 0.0, 0.03);
  std::vector<float> xs(static_cast<std::size_t>(2 * n));
  const float* up = u.data<float>();
  const std::int64_t* cp = c.data<std::int64_t>();
  const float* np = noise.data<float>();
  for (std::int64_t i = 0; i < n; ++i) {
    const double r = 0.1 + 0.9 * up[i];
    const double angle = 2 * std::numbers::pi * (static_cast<double>(cp[i]) / 3.0 + 1.5 * r);
    xs[2 * i] = static_cast<float>(r * std::cos(angle) + np[2 * i]);
    xs[2 * i + 1] = static_cast<float>(r * std::sin(angle) + np[2 * i + 1]);
  }
  return {from_vector(xs, {n, 2}), c};
}

std::shared_ptr<nn::sequential> build_model(generator& gen) {
  return std::make_shared<nn::sequential>(std::make_shared<nn::linear>(2, 64, gen), std::make_shared<nn::tanh>(),
                                          std::make_shared<nn::linear>(64, 64, gen), std::make_shared<nn::tanh>(),
                                          std::make_shared<nn::linear>(64, 3, gen));
}

struct evaluation {
  double loss;
  double accuracy;
};

evaluation evaluate(nn::unary_module& model, const dataset& d) {
  no_grad_guard guard;
  const tensor logits = model.forward(d.x);
  const double accuracy = mean(eq(argmax(logits, 1), d.y).to(dtype::float64)).item();
  return {nn::cross_entropy_loss(logits, d.y).item(), accuracy};
}

/// Rank `rank`'s shard of the training set (every world_size-th example, as DistributedSampler),
/// served in shuffled mini-batches, reshuffled after each pass.
class shard_sampler {
 public:
  shard_sampler(const dataset& all, int rank, int world_size, std::int64_t batch, std::uint64_t seed)
      : gen_(seed * 1000 + static_cast<std::uint64_t>(rank)), batch_(batch) {
    const tensor rows = arange(rank, static_cast<double>(all.x.size(0)), world_size);
    shard_ = {index_select(all.x, 0, rows), index_select(all.y, 0, rows)};
  }
  dataset next() {
    if (next_ + batch_ > shard_.x.size(0)) {
      const tensor perm = randperm(shard_.x.size(0), gen_);
      order_ = {index_select(shard_.x, 0, perm), index_select(shard_.y, 0, perm)};
      next_ = 0;
    }
    const std::int64_t start = next_;
    next_ += batch_;
    return {order_.x.narrow(0, start, batch_), order_.y.narrow(0, start, batch_)};
  }

 private:
  generator gen_;
  std::int64_t batch_;
  dataset shard_, order_;
  std::int64_t next_ = std::numeric_limits<std::int64_t>::max() / 2;
};

/// Rank 0's view of the run: progress lines, the loss curve and the final summary.
class reporter {
 public:
  explicit reporter(const options& o) : o_(o), t0_(std::chrono::steady_clock::now()) {}

  void step(int step, double loss) {
    curve_.add_step(step, loss);
    loss_sum_ += loss;
    ++losses_;
  }

  /// Prints the progress line: the mean training loss since the last one, the held-out figures.
  void eval(int step, const evaluation& e) {
    curve_.add_eval(step, e.loss, e.accuracy);
    if (step == 0) {
      std::printf("before training: held-out loss %.4f  accuracy %5.1f%%\n", e.loss, 100 * e.accuracy);
      std::fflush(stdout);
      return;
    }
    const double rate = step / std::max(elapsed(), 1e-9);
    std::printf("step %5d/%d  train loss %.4f  held-out loss %.4f  accuracy %5.1f%%  %5.0f steps/s  %4.1f s left\n",
                step, o_.steps, loss_sum_ / std::max(losses_, 1), e.loss, 100 * e.accuracy, rate,
                (o_.steps - step) / std::max(rate, 1e-9));
    std::fflush(stdout);
    loss_sum_ = 0;
    losses_ = 0;
  }

  void finish(int world_size, const evaluation& e, nn::module& model) {
    const std::filesystem::path dir(o_.out);
    std::filesystem::create_directories(dir);
    curve_.write_csv((dir / "loss.csv").string());
    curve_.write_svg((dir / "loss.svg").string(), "ddp_train: MLP 2-64-64-3 on 3 spirals, " +
                                                      std::to_string(world_size) + " ranks");
    save_safetensors(model.state_dict(), (dir / "model.safetensors").string(),
                     {{"format", "pt"}, {"architecture", "Sequential(Linear(2, 64), Tanh(), Linear(64, 64), Tanh(), "
                                                         "Linear(64, 3))"}});
    const double secs = elapsed();
    std::printf("done: %d steps on %d ranks in %.1f s (%.0f steps/s); held-out accuracy %.1f%% (target %.0f%%), "
                "held-out loss %.4f\nwrote %s, %s, %s\n",
                o_.steps, world_size, secs, o_.steps / secs, 100 * e.accuracy, 100 * o_.target, e.loss,
                (dir / "loss.csv").c_str(), (dir / "loss.svg").c_str(), (dir / "model.safetensors").c_str());
    std::fflush(stdout);
  }

 private:
  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

  const options& o_;
  std::chrono::steady_clock::time_point t0_;
  example::loss_curve curve_;
  double loss_sum_ = 0;
  int losses_ = 0;
};

/// One rank's training loop. Rank 0 evaluates, reports and returns the final held-out accuracy;
/// the other ranks return 1.
double train(node& n, const options& o) {
  const int rank = n.info().rank, world = n.info().world_size;
  generator data_gen(o.seed);  // the same data on every rank; each trains on its own shard
  const dataset train_set = spirals(6000, data_gen), held_out = spirals(3000, data_gen);
  generator init(o.seed + 100 + static_cast<std::uint64_t>(rank));  // DDP broadcasts rank 0's weights
  ddp::process_group_options po;
  ddp::use_node_faults(n, po);  // a TROUPE_FAULTS plan acts on DDP's points and payloads
  ddp::process_group group(n.store(), rank, world, "ddp_train", po);
  ddp::ddp_options ddp_opts;
  ddp_opts.node = &n;  // the bucket actors run on the node's actor system
  ddp::distributed_data_parallel model(build_model(init), group, ddp_opts);
  optim::adam opt(model.parameters(), {.lr = o.lr});
  shard_sampler sampler(train_set, rank, world, o.batch, o.seed);
  reporter report(o);
  if (rank == 0) report.eval(0, evaluate(model.module(), held_out));  // chance level: about 33%
  for (int step = 1; step <= o.steps; ++step) {
    const dataset batch = sampler.next();
    opt.zero_grad();
    const tensor loss = nn::cross_entropy_loss(model(batch.x), batch.y);
    backward(loss);
    opt.step();
    if (rank != 0) continue;
    report.step(step, loss.item());
    if (step % o.eval_every == 0 || step == o.steps) report.eval(step, evaluate(model.module(), held_out));
  }
  if (rank != 0) return 1.0;
  const evaluation final_eval = evaluate(model.module(), held_out);
  report.finish(world, final_eval, model.module());
  return final_eval.accuracy;
}

/// Trains, leaves the job gracefully (every rank), then fails when the accuracy missed the target.
void train_and_check(node& n, const options& o) {
  const double accuracy = train(n, o);
  n.shutdown(shutdown_mode::graceful);
  if (accuracy < o.target)
    throw error(errc::invalid_state, "held-out accuracy " + std::to_string(accuracy) + " is below the target " +
                                         std::to_string(o.target));
}

/// Hands rank 0's ephemeral store port to the other ranks (made before the fork).
class port_pipe {
 public:
  port_pipe() {
    if (::pipe(fds_) != 0) throw error(errc::io_error, "pipe() failed");
  }
  ~port_pipe() {
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  port_pipe(const port_pipe&) = delete;
  port_pipe& operator=(const port_pipe&) = delete;
  void publish(std::uint16_t port, int readers) {
    for (int i = 0; i < readers; ++i)
      if (::write(fds_[1], &port, sizeof(port)) != sizeof(port)) throw error(errc::io_error, "pipe write failed");
  }
  std::uint16_t read() {
    pollfd p{fds_[0], POLLIN, 0};
    if (::poll(&p, 1, 20000) != 1) throw error(errc::timeout, "no store port from rank 0 within 20 s");
    std::uint16_t port = 0;
    if (::read(fds_[0], &port, sizeof(port)) != sizeof(port)) throw error(errc::io_error, "pipe read failed");
    return port;
  }

 private:
  int fds_[2] = {-1, -1};
};

/// A random job token, shared by the forked ranks: another job on this host cannot join them.
std::string random_token() {
  std::random_device rd;
  return "ddp_train-" + std::to_string(rd()) + std::to_string(rd());
}

void run_rank(int rank, const options& o, const std::string& token, port_pipe& pipe) {
  node_options no;
  no.rank = rank;
  no.world_size = o.world_size;
  no.job_token = token;
  if (rank != 0) no.master_port = pipe.read();
  node n(no);
  if (rank == 0) pipe.publish(n.port(), o.world_size - 1);
  train_and_check(n, o);
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    o = parse(argc, argv);
  } catch (const error& e) {
    std::fprintf(stderr, "ddp_train: %s\n%s", e.what(), usage);
    return 2;
  }
  try {
    if (std::getenv("WORLD_SIZE") != nullptr) {  // started by troupe-run: this process is one rank
      node n(node_options::from_env());
      train_and_check(n, o);
      return 0;
    }
    std::printf("ddp_train: %d ranks, batch %d per rank, %d steps, Adam lr %g, target held-out accuracy %.0f%%\n",
                o.world_size, o.batch, o.steps, o.lr, 100 * o.target);
    std::fflush(stdout);
    port_pipe pipe;
    const std::string token = random_token();
    auto ranks = spawn(o.world_size, [&](int rank) { run_rank(rank, o, token, pipe); });
    if (!ranks.join(std::chrono::minutes(5))) throw error(errc::timeout, "ranks still running after 5 minutes");
  } catch (const error& e) {
    std::fprintf(stderr, "ddp_train failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
