// live_recovery: DDP training that survives the death of a rank without going back to a
// checkpoint (Note [live recovery] in troupe/ddp/live_group.hpp).
//
// Run without RANK in the environment, the program supervises two jobs through troupe-run:
//
//   1. the reference: 2 ranks train an MLP for --steps steps, no faults;
//   2. the faulty run: the same training under `troupe-run --restart rank`, with kills on a
//      schedule (default: kill rank 1 in its allreduce at step 40).
//
// When rank 1 dies, rank 0 keeps its state. Its step fails with peer_lost and it forms the next
// generation of the group. troupe-run starts a replacement for rank 1 alone. The
// replacement receives the parameters, the optimizer state, the step and the data position
// from rank 0, and the job replays the failed step. No checkpoint is written or read. The
// program prints the timeline and checks that it shows live recoveries: rank 0 started once,
// one replacement per kill. It compares the final parameters of both ranks with the reference,
// bit for bit.
//
// A fault is 1:STEP:POINT, POINT one of forward, backward, allreduce (rank 0 hosts the store, so
// only rank 1 is killed). The k-th fault fires in the k-th incarnation of rank 1.
// Exit codes: 0 when the parameters match, 1 when they differ or a job fails, 2 on bad usage.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "troupe/actors.hpp"
#include "troupe/autograd.hpp"
#include "troupe/ddp.hpp"
#include "fault_job.hpp"

using namespace troupe;
namespace fs = std::filesystem;
using namespace troupe::examples;

namespace {

constexpr const char* usage =
    "usage: live_recovery [options]\n"
    "Trains an MLP with DDP on 2 ranks under troupe-run --restart rank, kills rank 1 on a schedule,\n"
    "lets a replacement join the live job and fetch the state from rank 0 (no checkpoint), prints\n"
    "the timeline and checks that the final parameters of both ranks equal an undisturbed run's,\n"
    "bit for bit.\n"
    "  --steps S           training steps (default 120)\n"
    "  --hidden H          width of the hidden layer (default 32)\n"
    "  --kill 1:S:POINT    kill rank 1 at step S in POINT: forward, backward or allreduce\n"
    "                      (repeatable; default 1:40:allreduce). The k-th kill fires in the k-th\n"
    "                      incarnation of rank 1.\n"
    "  --undisturbed       no faults (the reference run)\n"
    "  --launcher PATH     troupe-run (default: ../tools/troupe-run beside this program)\n"
    "  --out DIR           timelines and parameters (default live_recovery_out)\n"
    "  --help              this text\n";

struct fault {
  int step = 0;
  std::string point;
};

struct options {
  int steps = 120;
  int hidden = 32;
  std::vector<fault> kills;
  std::string launcher;
  std::string out = "live_recovery_out";
};

fault parse_fault(const std::string& text) {
  const auto a = text.find(':'), b = text.find(':', a == std::string::npos ? a : a + 1);
  if (a == std::string::npos || b == std::string::npos) throw error(errc::bad_argument, "--kill needs 1:S:POINT, got '" + text + "'");
  if (integer("--kill", text.substr(0, a)) != 1) throw error(errc::bad_argument, "--kill: only rank 1 can be recovered live");
  fault f{integer("--kill", text.substr(a + 1, b - a - 1)), text.substr(b + 1)};
  if (f.point != "forward" && f.point != "backward" && f.point != "allreduce")
    throw error(errc::bad_argument, "--kill point must be forward, backward or allreduce, got '" + f.point + "'");
  if (f.step < 1) throw error(errc::bad_argument, "--kill needs step >= 1");
  return f;
}

options parse(int argc, char** argv) {
  options o;
  bool kills_given = false;
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
    if (a == "--steps") o.steps = integer(a, value());
    else if (a == "--hidden") o.hidden = integer(a, value());
    else if (a == "--kill") o.kills.push_back(parse_fault(value())), kills_given = true;
    else if (a == "--undisturbed") o.kills.clear(), kills_given = true;
    else if (a == "--launcher") o.launcher = value();
    else if (a == "--out") o.out = value();
    else throw error(errc::bad_argument, "unknown option " + a);
  }
  if (!kills_given) o.kills.push_back({40, "allreduce"});
  if (o.steps < 1 || o.hidden < 1 || o.hidden > 65536) throw error(errc::bad_argument, "need --steps >= 1 and 1 <= --hidden <= 65536");
  for (const auto& k : o.kills)
    if (k.step > o.steps) throw error(errc::bad_argument, "--kill at step " + std::to_string(k.step) + " is beyond --steps");
  return o;
}

// ---- one rank ----------------------------------------------------------------------------------

/// Dies by SIGKILL when this incarnation's fault is due (rank 1 only).
struct kill_switch {
  std::string out;
  std::optional<fault> armed;
  int step = 0;  ///< the step in progress
  void at(const char* point) const {
    if (!armed || armed->step != step || armed->point != point) return;
    timeline(out, "rank 1 killed at step " + std::to_string(step) + " in " + point);
    ::raise(SIGKILL);
  }
};

/// An identity layer that lets the kill switch fire inside the forward pass.
class forward_probe : public nn::unary_module {
 public:
  explicit forward_probe(const kill_switch& k) : kill_(k) {}
  tensor forward(const tensor& x) override {
    kill_.at("forward");
    return x;
  }

 private:
  const kill_switch& kill_;
};

/// Rank `rank`'s batches: a shuffled pass over its shard; the position is (epoch, index).
struct sampler {
  tensor x, y;
  std::int64_t epoch = 0, index = 0;
  std::uint64_t seed;
  std::int64_t batch = 16;
  std::pair<tensor, tensor> next() {
    if ((index + 1) * batch > x.size(0)) ++epoch, index = 0;
    generator g(seed + static_cast<std::uint64_t>(epoch));
    const tensor rows = randperm(x.size(0), g).narrow(0, index * batch, batch);
    ++index;
    return {index_select(x, 0, rows), index_select(y, 0, rows)};
  }
};

/// Joins the job. A replacement may reach rank 0 before rank 0 saw its predecessor die; the
/// identity is then still held (unauthorized). It tries again until rank 0 released it, up to 30 s.
node join_node(bool replacement) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    try {
      return node(node_options::from_env());
    } catch (const error& e) {
      if (!replacement || e.code() != errc::unauthorized || std::chrono::steady_clock::now() > deadline) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // a retry pace, not a synchronisation
    }
  }
}

struct trainer {
  const options& o;
  kill_switch& kill;
  sampler& data;
  std::shared_ptr<nn::sequential> net;
  optim::adam& opt;
  ddp::live_group& live;
  node& n;
  std::optional<ddp::distributed_data_parallel> model;

  // DDP over the live group's current generation.
  void wrap() {
    model.reset();
    ddp::ddp_options opts;
    opts.node = &n;  // the bucket actors run on the node's actor system
    model.emplace(net, live.group(), opts);
    model->register_comm_hook([this, base = ddp::allreduce_hook()](ddp::collective_group& pg, ddp::grad_bucket& b) {
      kill.at("allreduce");
      return base(pg, b);
    });
  }
  void step() {
    const auto [x, y] = data.next();
    opt.zero_grad();
    const tensor pred = (*model)(x);
    register_hook(pred, [this](const tensor& g) {
      kill.at("backward");
      return g;
    });
    backward(nn::mse_loss(pred, y));
    opt.step();
  }
};

void run_rank(const options& o) {
  const char* rc = std::getenv("TROUPE_RESTART_COUNT");
  const char* rp = std::getenv("TROUPE_REPLACEMENT");
  const int incarnation = rc ? std::atoi(rc) : 0;
  const bool replacement = rp && std::string(rp) == "1";
  if (replacement) timeline(o.out, "rank " + std::string(std::getenv("RANK")) + " replacement process started");
  node n = join_node(replacement);
  const int rank = n.info().rank, world = n.info().world_size;
  if (rank == 0) timeline(o.out, "rank 0 started");
  kill_switch kill{o.out, std::nullopt, 0};
  if (rank == 1 && incarnation < static_cast<int>(o.kills.size())) kill.armed = o.kills[incarnation];
  generator data_gen(7);
  const tensor all_x = randn({512, 8}, data_gen), all_y = randn({512, 4}, data_gen);
  const tensor rows = arange(rank, 512, world);
  sampler data{index_select(all_x, 0, rows), index_select(all_y, 0, rows), 0, 0, 100 + static_cast<std::uint64_t>(rank)};
  generator init(11);
  auto net = std::make_shared<nn::sequential>(std::make_shared<nn::linear>(8, o.hidden, init), std::make_shared<nn::tanh>(),
                                              std::make_shared<forward_probe>(kill), std::make_shared<nn::linear>(o.hidden, 4, init));
  optim::adam opt(net->parameters(), {.lr = 0.01});
  ddp::live_group live(n.store(), rank, world, "live_recovery", replacement);
  live.track("model", *net);
  live.track("optimizer", opt);
  live.track("data_epoch", data.epoch);
  live.track("data_index", data.index);
  std::int64_t done = live.start();
  if (replacement)
    timeline(o.out, "rank " + std::to_string(rank) + " replacement joined generation " + std::to_string(live.generation()) +
                        ": state of step " + std::to_string(done) + " from rank " + std::to_string(live.last_source()) + " (" +
                        std::to_string(live.last_state_bytes()) + " bytes), no checkpoint read");
  trainer t{o, kill, data, net, opt, live, n, std::nullopt};
  t.wrap();
  bool recovered = false;
  while (done < o.steps) {
    try {
      kill.step = static_cast<int>(done + 1);
      t.step();
      live.commit(++done);
      if (recovered && rank == 0) timeline(o.out, "rank 0 completed step " + std::to_string(done) + ", the first after the recovery");
      recovered = false;
    } catch (const error& e) {
      if (!ddp::live_group::recoverable(e)) throw;
      timeline(o.out, "rank " + std::to_string(rank) + " step " + std::to_string(done + 1) + " failed: " + e.message());
      t.model.reset();
      done = live.recover();
      timeline(o.out, "rank " + std::to_string(rank) + " formed generation " + std::to_string(live.generation()) +
                          ", replaying from step " + std::to_string(done + 1));
      t.wrap();
      recovered = true;
    }
  }
  t.model.reset();
  save_state_dict(net->state_dict(), (fs::path(o.out) / ("final-rank" + std::to_string(rank) + ".params")).string());
  if (rank == 0) timeline(o.out, "training finished at step " + std::to_string(o.steps));
  n.shutdown(shutdown_mode::graceful);
}

// ---- the supervisor ------------------------------------------------------------------------------

int run_job(const options& o, const std::string& self, const std::string& dir, bool faults) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string cmd = quote(o.launcher) + " --nproc-per-node 2 --timeout-s 300 --restart rank --max-restarts " +
                    std::to_string(faults ? o.kills.size() : 0) + " -- " + quote(self) + " --steps " + std::to_string(o.steps) +
                    " --hidden " + std::to_string(o.hidden) + " --out " + quote(dir);
  if (!faults) cmd += " --undisturbed";
  for (const auto& k : o.kills)
    if (faults) cmd += " --kill 1:" + std::to_string(k.step) + ":" + k.point;
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/// Why the timeline in `dir` does not show `kills` live recoveries; empty when it does. Rank 0
/// must have started once. Each kill must have brought a replacement that got its state from a
/// live peer.
std::string not_live(const std::string& dir, std::size_t kills) {
  std::ifstream in(fs::path(dir) / "timeline.txt");
  std::size_t starts = 0, joins = 0;
  for (std::string line; std::getline(in, line);) {
    starts += line.find("rank 0 started") != std::string::npos;
    joins += line.find("replacement joined") != std::string::npos;
  }
  if (starts != 1) return "rank 0 started " + std::to_string(starts) + " times";
  if (joins != kills) return std::to_string(joins) + " replacements joined for " + std::to_string(kills) + " kills";
  return {};
}

int supervise(options o) {
  const std::string self = fs::canonical("/proc/self/exe").string();
  if (o.launcher.empty()) o.launcher = (fs::path(self).parent_path().parent_path() / "tools" / "troupe-run").string();
  std::printf("live_recovery: 2 ranks, %d steps, no checkpoints; faults:", o.steps);
  for (const auto& k : o.kills) std::printf(" kill rank 1 at step %d in %s;", k.step, k.point.c_str());
  std::printf("\n");
  std::fflush(stdout);
  const std::string ref = (fs::path(o.out) / "reference").string(), bad = (fs::path(o.out) / "faulty").string();
  if (const int rc = run_job(o, self, ref, false); rc != 0) {
    std::fprintf(stderr, "live_recovery: the reference job failed (troupe-run exit %d)\n", rc);
    return 1;
  }
  const double t0 = now_ms();
  const int rc = run_job(o, self, bad, true);
  print_timeline(bad, t0);
  if (rc != 0) {
    std::fprintf(stderr, "live_recovery: the faulty job failed (troupe-run exit %d)\n", rc);
    return 1;
  }
  if (const std::string why = not_live(bad, o.kills.size()); !why.empty()) {
    std::fprintf(stderr, "live_recovery: the faulty job did not recover live: %s\n", why.c_str());
    return 1;
  }
  const state_dict want = load_state_dict_file(ref + "/final-rank0.params");
  bool same = true;
  for (int r = 0; r < 2; ++r) same = same && same_bits(want, load_state_dict_file(bad + "/final-rank" + std::to_string(r) + ".params"));
  std::printf("final parameters of both ranks %s the undisturbed run's bit for bit\n", same ? "equal" : "DIFFER FROM");
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    o = parse(argc, argv);
  } catch (const error& e) {
    std::fprintf(stderr, "live_recovery: %s\n%s", e.what(), usage);
    return 2;
  }
  try {
    if (std::getenv("RANK") != nullptr) {
      run_rank(o);
      return 0;
    }
    return supervise(o);
  } catch (const error& e) {
    std::fprintf(stderr, "live_recovery failed: %s\n", e.what());
    return 1;
  }
}
