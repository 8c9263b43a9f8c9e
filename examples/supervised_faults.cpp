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
// fault fires once.
//
// With --bed tools/netns_bed.sh (root), both jobs run on two namespace hosts, one rank and one
// troupe-run per host. The attempt after the kills cuts host 1 off at step 90. Rank 1 asks for
// the cut and waits until it is in. The supervisor cuts the host (nftables), waits until
// rank 0 failed with peer_lost naming rank 1, and heals it. The launchers restart the job (the
// master's --max-restarts is the job's budget) and it resumes from the last checkpoint. Without
// --bed, or where namespaces cannot be made, the cut is reported as skipped.
//
// TROUPE_FAULTS=PLAN (docs/faults.md) reaches the faulty job's ranks, their process group
// included (troupe/ddp/node_faults.hpp); the reference job runs without it.
//
// Under troupe-run (RANK set) the program is one rank of a job; the supervisor starts it so.
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
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "troupe/actors.hpp"
#include "troupe/autograd.hpp"
#include "troupe/ddp.hpp"
#include "fault_job.hpp"
#include "namespace_hosts.hpp"
#include "troupe/ddp/node_faults.hpp"

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
    "  --bed PATH          tools/netns_bed.sh: run on two namespace hosts (root), one troupe-run\n"
    "                      per host, and cut host 1 off at step 90 in the attempt after the kills\n"
    "  --help              this text\n"
    "Without --bed (or where namespaces cannot be made) the cut at step 90 is skipped.\n"
    "TROUPE_FAULTS=PLAN (docs/faults.md) applies the plan to every attempt of the faulty job (its\n"
    "DDP points, collective payloads, RPC and store traffic); the reference runs without it. The\n"
    "DDP points' step is the loop's step minus 1, also after a resume.\n";

constexpr int cut_step = 90;

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
  std::string bed;       ///< netns_bed.sh; empty: one host
  int cut_attempt = -1;  ///< ranks: the attempt in which host 1 is cut at cut_step (-1: none)
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
    else if (a == "--bed") o.bed = value();
    else if (a == "--cut-attempt") o.cut_attempt = integer(a, value());  // set by the supervisor
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

/// Rank 1 of the attempt that cuts its host. It asks the supervisor for the cut and waits (at
/// most 30 s) until it is in, so the step's allreduce runs across the cut.
void request_cut(const options& o, int rank, int attempt, int step) {
  if (rank != 1 || attempt != o.cut_attempt || step != cut_step) return;
  timeline(o.out, "rank 1 asks for its host to be cut off at step " + std::to_string(step));
  std::ofstream(fs::path(o.out) / "cut-request").put('1');
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!fs::exists(fs::path(o.out) / "cut-done") && std::chrono::steady_clock::now() < end)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // polling the supervisor's file
}

void run_rank(const options& o) {
  const auto nopts = node_options::from_env();
  node n(nopts);
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
  ddp::process_group_options po;
  po.tcp_address = advertised_address(nopts.listen_addr, nopts.master_addr);  // this host's address
  ddp::use_node_faults(n, po);  // a TROUPE_FAULTS plan acts on DDP's points and payloads
  ddp::process_group group(n.store(), rank, world, "supervised_faults", po);
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
  model->set_step(start);  // the DDP fault points count steps as in an undisturbed run (forward k is step k-1)
  if (rank == 0)
    timeline(o.out, "attempt " + std::to_string(attempt) + ": training resumed at step " + std::to_string(start + 1) +
                        (start > 0 ? " from the checkpoint of step " + std::to_string(start) : " from scratch"));
  int step = static_cast<int>(start) + 1;
  try {
    for (; step <= o.steps; ++step) {
      request_cut(o, rank, attempt, step);
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
  } catch (const error& e) {
    timeline(o.out, "rank " + std::to_string(rank) + " failed at step " + std::to_string(step) + ": " + e.what());
    throw;
  }
  if (rank == 0) {
    save_state_dict(net->state_dict(), (fs::path(o.out) / "final.params").string());
    timeline(o.out, "attempt " + std::to_string(attempt) + ": training finished at step " + std::to_string(o.steps));
  }
  model.reset();
  n.shutdown(shutdown_mode::graceful);
}

// ---- the supervisor ------------------------------------------------------------------------------

/// The command line of one rank of a job.
std::vector<std::string> rank_command(const options& o, const std::string& self, const std::string& dir, bool faults) {
  std::vector<std::string> a{self, "--steps", std::to_string(o.steps), "--every", std::to_string(o.every), "--hidden",
                             std::to_string(o.hidden), "--out", dir};
  if (!faults) a.push_back("--undisturbed");
  for (const auto& k : o.kills)
    if (faults) a.insert(a.end(), {"--kill", std::to_string(k.rank) + ":" + std::to_string(k.step) + ":" + k.point});
  return a;
}

/// The cut of host 1 in the faulty job on namespace hosts. It cuts when rank 1 asks. It heals
/// once rank 0 failed (it saw the loss) or 20 s after the cut.
struct host_cut {
  bool in = false, healed = false;
  std::chrono::steady_clock::time_point at{};

  void step(const std::string& dir, namespace_hosts& hosts) {
    if (!in && fs::exists(fs::path(dir) / "cut-request")) {
      hosts.cut(1);
      in = true;
      at = std::chrono::steady_clock::now();
      timeline(dir, "host 1 (" + hosts.name(1) + ", rank 1) cut off: every packet dropped both ways");
      std::ofstream(fs::path(dir) / "cut-done").put('1');
    } else if (in && !healed && (rank0_failed(dir) || std::chrono::steady_clock::now() - at > std::chrono::seconds(20))) {
      hosts.heal(1);
      healed = true;
      timeline(dir, "host 1 healed");
    }
  }
  static bool rank0_failed(const std::string& dir) {
    std::ifstream in(fs::path(dir) / "timeline.txt");
    for (std::string line; std::getline(in, line);)
      if (line.find(" rank 0 failed at step " + std::to_string(cut_step) + ":") != std::string::npos) return true;
    return false;
  }
};

/// Runs a job with one troupe-run per namespace host (1 rank each); the master's --max-restarts
/// is the job's budget. Returns the worst launcher exit code.
int run_on_hosts(const options& o, const std::string& self, const std::string& dir, bool faults, namespace_hosts& hosts) {
  auto ranks = rank_command(o, self, dir, faults);
  if (faults && o.steps >= cut_step) ranks.insert(ranks.end(), {"--cut-attempt", std::to_string(o.kills.size())});
  const std::size_t budget = (faults ? o.kills.size() + 1 : 0) + 1;
  std::vector<pid_t> launchers;
  for (int h = 0; h < 2; ++h) {
    std::vector<std::string> cmd{"env"};
    if (!faults) cmd.insert(cmd.end(), {"-u", "TROUPE_FAULTS"});  // the reference runs without the plan
    cmd.insert(cmd.end(), {"TROUPE_JOB_TOKEN=supervised-faults-" + std::to_string(::getpid()), o.launcher,
                                 "--nnodes", "2", "--node-rank", std::to_string(h), "--nproc-per-node", "1", "--master-addr",
                                 namespace_hosts::addr(0), "--master-port", "29400", "--max-restarts", std::to_string(budget),
                                 "--timeout-s", "300", "--join-timeout-s", "60", "--"});
    cmd.insert(cmd.end(), ranks.begin(), ranks.end());
    launchers.push_back(hosts.start(h, cmd));
  }
  std::vector<int> codes(launchers.size(), -1);
  host_cut cut;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(400);
  while (std::count(codes.begin(), codes.end(), -1) > 0 && std::chrono::steady_clock::now() < end) {
    for (std::size_t i = 0; i < launchers.size(); ++i)
      if (codes[i] < 0) codes[i] = hosts.poll_exit(launchers[i]);
    cut.step(dir, hosts);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling children and the rank's request
  }
  if (cut.in && !cut.healed) hosts.heal(1);
  return *std::min_element(codes.begin(), codes.end()) < 0 ? 1 : *std::max_element(codes.begin(), codes.end());
}

int run_job(const options& o, const std::string& self, const std::string& dir, bool faults, namespace_hosts* hosts) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  if (hosts) return run_on_hosts(o, self, dir, faults, *hosts);
  // One restart beyond the schedule absorbs a failure outside it: a port taken by another
  // program between troupe-run picking it and rank 0 binding it. The timeline shows any such
  // extra attempt, and the result must still match bit for bit.
  std::string cmd = faults ? "" : "env -u TROUPE_FAULTS ";  // the reference runs without the plan
  cmd += quote(o.launcher) + " --nproc-per-node 2 --timeout-s 300 --max-restarts " +
         std::to_string((faults ? o.kills.size() : 0) + 1) + " --";
  for (const auto& a : rank_command(o, self, dir, faults)) cmd += " " + quote(a);
  const int status = std::system(cmd.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

/// The namespace hosts of --bed, or null with `skipped` saying why the cut does not run.
std::unique_ptr<namespace_hosts> make_hosts(const options& o, std::string& skipped) {
  if (o.bed.empty()) {
    skipped = "pass --bed tools/netns_bed.sh, as root, for two namespace hosts";
    return nullptr;
  }
  if (o.steps < cut_step) {
    skipped = "--steps is below " + std::to_string(cut_step);
    return nullptr;
  }
  auto hosts = std::make_unique<namespace_hosts>(o.bed, 2);
  if (hosts->available()) return hosts;
  skipped = hosts->why();
  return nullptr;
}

int supervise(options o, const char* argv0) {
  const std::string self = fs::canonical("/proc/self/exe").string();
  if (o.launcher.empty()) o.launcher = (fs::path(self).parent_path().parent_path() / "tools" / "troupe-run").string();
  (void)argv0;
  std::string skipped;
  const auto hosts = make_hosts(o, skipped);
  if (hosts)
    std::printf("supervised_faults: 2 ranks on 2 namespace hosts (%s, %s), one troupe-run each, %d steps, a checkpoint every %d steps; faults:",
                hosts->name(0).c_str(), hosts->name(1).c_str(), o.steps, o.every);
  else
    std::printf("supervised_faults: 2 ranks, %d steps, a checkpoint every %d steps; faults:", o.steps, o.every);
  for (const auto& k : o.kills) std::printf(" kill rank %d at step %d in %s;", k.rank, k.step, k.point.c_str());
  if (hosts) std::printf(" cut host 1 off at step %d (attempt %zu)\n", cut_step, o.kills.size());
  else std::printf(" cut a host at step %d: skipped (%s)\n", cut_step, skipped.c_str());
  std::fflush(stdout);
  const std::string ref = (fs::path(o.out) / "reference").string(), bad = (fs::path(o.out) / "faulty").string();
  if (const int rc = run_job(o, self, ref, false, hosts.get()); rc != 0) {
    std::fprintf(stderr, "supervised_faults: the reference job failed (troupe-run exit %d)\n", rc);
    return 1;
  }
  const double t0 = now_ms();
  const int rc = run_job(o, self, bad, true, hosts.get());
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
