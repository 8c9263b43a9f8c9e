// supervised_faults: DDP training that survives the death of a rank and ends with exactly the
// parameters of an undisturbed run.
//
// Run without RANK in the environment, the program supervises two jobs through troupe-run:
//
//   1. the reference: 2 ranks train an MLP for --steps steps, no faults;
//   2. the faulty run: the same training with --max-restarts, under a schedule of faults
//      (default: kill rank 1 in its forward pass at step 40).
//
// Each rank checkpoints every --every steps with ddp::checkpointer (Note [Job checkpoint]).
// When a rank dies, troupe-run stops every rank and starts the job again; the ranks resume at
// the last complete checkpoint. The program prints the timeline of faults and recoveries that
// the ranks wrote, then compares the final parameters of both jobs bit for bit.
//
// A fault is RANK:STEP:POINT, POINT one of forward, backward, allreduce, checkpoint. The k-th
// fault of the schedule fires in the k-th attempt of the job (TROUPE_RESTART_COUNT = k), so each
// fault fires once. Cutting a host off at step 90 needs two namespace hosts (tools/netns_bed.sh,
// root) and restarts across hosts, which troupe-run does not offer: that fault is reported as
// skipped.
//
// Under troupe-run (RANK set) the program is one rank of a job; the supervisor starts it so.
// Exit codes: 0 when the parameters match, 1 when they differ or a job fails, 2 on bad usage.
#include <fcntl.h>
#include <unistd.h>

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
    "usage: supervised_faults [options]\n"
    "Trains an MLP with DDP on 2 ranks under troupe-run, kills ranks on a schedule, lets the job\n"
    "restart from its last complete checkpoint, prints the timeline of faults and recoveries and\n"
    "checks that the final parameters equal those of an undisturbed run, bit for bit.\n"
    "  --steps S           training steps (default 120)\n"
    "  --every K           checkpoint every K steps (default 10)\n"
    "  --hidden H          width of the hidden layer (default 32)\n"
    "  --kill R:S:POINT    kill rank R at step S in POINT: forward, backward, allreduce or\n"
    "                      checkpoint (repeatable; default 1:40:forward). The k-th kill fires in\n"
    "                      the k-th attempt of the job.\n"
    "  --undisturbed       no faults (the reference run)\n"
    "  --launcher PATH     troupe-run (default: ../tools/troupe-run beside this program)\n"
    "  --out DIR           checkpoints, timelines and parameters (default supervised_faults_out)\n"
    "  --help              this text\n"
    "Cutting a host off at step 90 needs the namespace test bed (tools/netns_bed.sh) and restarts\n"
    "across hosts; the run says that it is skipped.\n";

struct fault {
  int rank = 0;
  int step = 0;
  std::string point;
};

struct options {
  int steps = 120;
  int every = 10;
  int hidden = 32;
  std::vector<fault> kills;
  std::string launcher;
  std::string out = "supervised_faults_out";
};

fault parse_fault(const std::string& text) {
  const auto a = text.find(':'), b = text.find(':', a == std::string::npos ? a : a + 1);
  if (a == std::string::npos || b == std::string::npos) throw error(errc::bad_argument, "--kill needs R:S:POINT, got '" + text + "'");
  fault f{integer("--kill", text.substr(0, a)), integer("--kill", text.substr(a + 1, b - a - 1)), text.substr(b + 1)};
  if (f.point != "forward" && f.point != "backward" && f.point != "allreduce" && f.point != "checkpoint")
    throw error(errc::bad_argument, "--kill point must be forward, backward, allreduce or checkpoint, got '" + f.point + "'");
  if (f.rank < 0 || f.rank > 1 || f.step < 1) throw error(errc::bad_argument, "--kill needs rank 0 or 1 and step >= 1");
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
    else if (a == "--every") o.every = integer(a, value());
    else if (a == "--hidden") o.hidden = integer(a, value());
    else if (a == "--kill") o.kills.push_back(parse_fault(value())), kills_given = true;
    else if (a == "--undisturbed") o.kills.clear(), kills_given = true;
    else if (a == "--launcher") o.launcher = value();
    else if (a == "--out") o.out = value();
    else throw error(errc::bad_argument, "unknown option " + a);
  }
  if (!kills_given) o.kills.push_back({1, 40, "forward"});
  if (o.steps < 1 || o.every < 1 || o.hidden < 1 || o.hidden > 65536)
    throw error(errc::bad_argument, "need --steps >= 1, --every >= 1 and 1 <= --hidden <= 65536");
  for (const auto& k : o.kills)
    if (k.step > o.steps) throw error(errc::bad_argument, "--kill at step " + std::to_string(k.step) + " is beyond --steps");
  return o;
}

// ---- one rank ----------------------------------------------------------------------------------

/// The kill hook of this example: dies by SIGKILL when this rank's fault of this attempt is due.
class kill_switch {
 public:
  kill_switch(const options& o, int rank, int attempt) : out_(o.out), rank_(rank) {
    if (attempt < static_cast<int>(o.kills.size()) && o.kills[attempt].rank == rank) armed_ = o.kills[attempt];
  }
  void at(int step, const char* point) const {
    if (!armed_ || armed_->step != step || armed_->point != point) return;
    timeline(out_, "rank " + std::to_string(rank_) + " killed at step " + std::to_string(step) + " in " + point);
    ::raise(SIGKILL);
  }
  int step = 0;  ///< the step in progress

 private:
  std::string out_;
  int rank_;
  std::optional<fault> armed_;
};

/// An identity layer that lets the kill switch fire inside the forward pass.
class forward_probe : public nn::unary_module {
 public:
  explicit forward_probe(const kill_switch& k) : kill_(k) {}
  tensor forward(const tensor& x) override {
    kill_.at(kill_.step, "forward");
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

void run_rank(const options& o) {
  node n(node_options::from_env());
  const int rank = n.info().rank, world = n.info().world_size;
  const char* rc = std::getenv("TROUPE_RESTART_COUNT");
  const int attempt = rc ? std::atoi(rc) : 0;
  kill_switch kill(o, rank, attempt);
  if (rank == 0) timeline(o.out, "attempt " + std::to_string(attempt) + ": job started");
  generator data_gen(7);
  const tensor all_x = randn({512, 8}, data_gen), all_y = randn({512, 4}, data_gen);
  const tensor rows = arange(rank, 512, world);
  sampler data{index_select(all_x, 0, rows), index_select(all_y, 0, rows), 0, 0, 100 + static_cast<std::uint64_t>(rank)};
  generator init(11);
  auto net = std::make_shared<nn::sequential>(std::make_shared<nn::linear>(8, o.hidden, init), std::make_shared<nn::tanh>(),
                                              std::make_shared<forward_probe>(kill), std::make_shared<nn::linear>(o.hidden, 4, init));
  ddp::process_group group(n.store(), rank, world, "supervised_faults");
  ddp::ddp_options ddp_opts;
  ddp_opts.node = &n;  // the bucket actors run on the node's actor system
  // An optional: the wrapper goes before the node's shutdown (its bucket actors run on the node).
  std::optional<ddp::distributed_data_parallel> model;
  model.emplace(net, group, ddp_opts);
  model->register_comm_hook([&kill, base = ddp::allreduce_hook()](ddp::collective_group& pg, ddp::grad_bucket& b) {
    kill.at(kill.step, "allreduce");
    return base(pg, b);
  });
  optim::adam opt(model->parameters(), {.lr = 0.01});
  ddp::checkpointer_options co;
  co.dir = fs::path(o.out) / "checkpoints";
  co.every = o.every;
  co.after_part_written = [&kill](std::int64_t s) { kill.at(static_cast<int>(s), "checkpoint"); };
  ddp::checkpointer ckpt(group, co);
  ckpt.track("model", *net);
  ckpt.track("optimizer", opt);
  ckpt.track("data_epoch", data.epoch);
  ckpt.track("data_index", data.index);
  const std::int64_t start = ckpt.restore();
  if (rank == 0)
    timeline(o.out, "attempt " + std::to_string(attempt) + ": training resumed at step " + std::to_string(start + 1) +
                        (start > 0 ? " from the checkpoint of step " + std::to_string(start) : " from scratch"));
  for (int step = static_cast<int>(start) + 1; step <= o.steps; ++step) {
    kill.step = step;
    const auto [x, y] = data.next();
    opt.zero_grad();
    const tensor pred = (*model)(x);
    register_hook(pred, [&kill, step](const tensor& g) {
      kill.at(step, "backward");
      return g;
    });
    backward(nn::mse_loss(pred, y));
    opt.step();
    if (ckpt.maybe_save(step) && rank == 0 && step % (4 * o.every) == 0)
      timeline(o.out, "checkpoint of step " + std::to_string(step) + " complete (" + std::to_string(ckpt.part_bytes()) + " bytes per rank)");
  }
  if (rank == 0) {
    save_state_dict(net->state_dict(), (fs::path(o.out) / "final.params").string());
    timeline(o.out, "attempt " + std::to_string(attempt) + ": training finished at step " + std::to_string(o.steps));
  }
  model.reset();
  n.shutdown(shutdown_mode::graceful);
}

// ---- the supervisor ------------------------------------------------------------------------------

int run_job(const options& o, const std::string& self, const std::string& dir, bool faults) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  // One restart beyond the schedule absorbs a failure outside it (a port taken by another
  // program between troupe-run picking it and rank 0 binding it); the timeline shows any such
  // extra attempt, and the result must still match bit for bit.
  std::string cmd = quote(o.launcher) + " --nproc-per-node 2 --timeout-s 300 --max-restarts " +
                    std::to_string((faults ? o.kills.size() : 0) + 1) + " -- " + quote(self) + " --steps " +
                    std::to_string(o.steps) + " --every " + std::to_string(o.every) + " --hidden " + std::to_string(o.hidden) +
                    " --out " + quote(dir);
  if (!faults) cmd += " --undisturbed";
  for (const auto& k : o.kills)
    if (faults) cmd += " --kill " + std::to_string(k.rank) + ":" + std::to_string(k.step) + ":" + k.point;
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

int supervise(options o, const char* argv0) {
  const std::string self = fs::canonical("/proc/self/exe").string();
  if (o.launcher.empty()) o.launcher = (fs::path(self).parent_path().parent_path() / "tools" / "troupe-run").string();
  (void)argv0;
  std::printf("supervised_faults: 2 ranks, %d steps, a checkpoint every %d steps; faults:", o.steps, o.every);
  for (const auto& k : o.kills) std::printf(" kill rank %d at step %d in %s;", k.rank, k.step, k.point.c_str());
  std::printf(" cut a host at step 90: skipped (needs the netns test bed and restarts across hosts)\n");
  std::fflush(stdout);
  const std::string ref = (fs::path(o.out) / "reference").string(), bad = (fs::path(o.out) / "faulty").string();
  if (const int rc = run_job(o, self, ref, false); rc != 0) {
    std::fprintf(stderr, "supervised_faults: the reference job failed (troupe-run exit %d)\n", rc);
    return 1;
  }
  const double t0 = now_ms();
  const int rc = run_job(o, self, bad, true);
  print_timeline(bad, t0);
  if (rc != 0) {
    std::fprintf(stderr, "supervised_faults: the faulty job failed (troupe-run exit %d)\n", rc);
    return 1;
  }
  const bool same = same_bits(load_state_dict_file(ref + "/final.params"), load_state_dict_file(bad + "/final.params"));
  std::printf("final parameters %s the undisturbed run's bit for bit\n", same ? "equal" : "DIFFER FROM");
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    o = parse(argc, argv);
  } catch (const error& e) {
    std::fprintf(stderr, "supervised_faults: %s\n%s", e.what(), usage);
    return 2;
  }
  try {
    if (std::getenv("RANK") != nullptr) {
      run_rank(o);
      return 0;
    }
    return supervise(o, argv[0]);
  } catch (const error& e) {
    std::fprintf(stderr, "supervised_faults failed: %s\n", e.what());
    return 1;
  }
}
