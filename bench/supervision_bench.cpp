// supervision_bench: the time from a rank's death to training resumed, and the size of the
// checkpoint. It measures two ways back: the job restarts from its last complete checkpoint
// (troupe-run --max-restarts, ddp::checkpointer), or a replacement joins the live job
// (troupe-run --restart rank, ddp::live_group).
//
// Each run starts examples/supervised_faults as a 2-rank job under troupe-run with one fault:
// rank 1 dies by SIGKILL in its forward pass. The ranks write a timeline (wall clock, one file).
// restart_resume_s is the time from the "killed" line to the "training resumed" line of the next
// attempt. It covers the launcher seeing the death, stopping the survivor and starting both
// ranks. It covers the job forming again, and the checkpoint being found, checked and loaded.
// checkpoint_bytes is the size of one complete checkpoint: every part and the manifest. The
// final parameters are checked against an undisturbed run beside the timing; supervised_faults
// does that and exits 1 if not.
//
// live_recovery_s runs examples/live_recovery the same way, rank 1 killed in its forward pass at
// step 25. It is the time from the "killed" line to rank 0's "the first after the recovery"
// line. It covers the survivor seeing peer_lost, the replacement starting and joining, and the
// next generation of the group forming. It covers the state broadcast from rank 0 and the
// replayed step completing.
// live_recovery checks both ranks' final parameters against an undisturbed run (exit 1 if not).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.hpp"

namespace tb = troupe::bench;
namespace fs = std::filesystem;

namespace {

// Seconds from the kill to the next line containing `until` in `dir`/faulty/timeline.txt; -1 if
// either is absent.
double resume_seconds(const fs::path& dir, const std::string& until) {
  std::ifstream in(dir / "faulty" / "timeline.txt");
  double killed = -1, resumed = -1;
  std::vector<std::pair<double, std::string>> lines;
  for (std::string line; std::getline(in, line);) {
    const auto sp = line.find(' ');
    if (sp == std::string::npos) continue;
    lines.emplace_back(std::stod(line.substr(0, sp)), line.substr(sp + 1));
  }
  std::sort(lines.begin(), lines.end());
  for (const auto& [t, text] : lines) {
    if (killed < 0 && text.find(" killed at step ") != std::string::npos) killed = t;
    else if (killed >= 0 && resumed < 0 && text.find(until) != std::string::npos) resumed = t;
  }
  return killed >= 0 && resumed >= 0 ? (resumed - killed) / 1000.0 : -1;
}

// Bytes of the newest complete checkpoint under `dir`/faulty/checkpoints.
double checkpoint_bytes(const fs::path& dir) {
  fs::path newest;
  for (const auto& e : fs::directory_iterator(dir / "faulty" / "checkpoints"))
    if (fs::exists(e.path() / "MANIFEST") && e.path().filename() > newest.filename()) newest = e.path();
  double total = 0;
  if (!newest.empty())
    for (const auto& f : fs::directory_iterator(newest)) total += static_cast<double>(fs::file_size(f.path()));
  return total;
}

// Runs `program` `runs` times with `args`; returns the seconds from the kill to `until` per run,
// or an empty vector when a run fails.
std::vector<double> time_runs(const std::string& program, const std::string& args, const std::string& until, int runs,
                              const fs::path& dir, double* bytes) {
  std::vector<double> times;
  for (int i = 0; i < runs; ++i) {
    const std::string cmd = program + " --launcher " + TROUPE_RUN_PATH + " " + args + " --out " + dir.string() + " > " +
                            (dir.string() + ".log") + " 2>&1";
    fs::create_directories(dir);
    if (std::system(cmd.c_str()) != 0) {
      std::fprintf(stderr, "supervision_bench: %s failed (log: %s.log)\n", program.c_str(), dir.c_str());
      return {};
    }
    const double s = resume_seconds(dir, until);
    if (s < 0) {
      std::fprintf(stderr, "supervision_bench: no kill and recovery in the timeline (%s)\n", dir.c_str());
      return {};
    }
    times.push_back(s);
    if (bytes) *bytes = checkpoint_bytes(dir);
  }
  return times;
}

}  // namespace

int main(int argc, char** argv) {
  tb::check_args(argc, argv, "supervision_bench",
                 "Rank death to training resumed: restart from the last complete checkpoint, and live recovery (2 ranks).");
  const bool quick = tb::quick_mode(argc, argv);
  const int runs = quick ? 1 : 3, hidden = quick ? 256 : 4096, steps = 40;
  const fs::path dir = fs::temp_directory_path() / ("supervision_bench_" + std::to_string(::getpid()));
  double bytes = 0;
  const std::string common = "--steps " + std::to_string(steps) + " --hidden " + std::to_string(hidden) + " --kill 1:25:forward";
  const auto times = time_runs(TROUPE_SUPERVISED_FAULTS, common + " --every 10", "training resumed", runs, dir, &bytes);
  if (times.empty()) return 1;
  const auto live = time_runs(TROUPE_LIVE_RECOVERY, common, "the first after the recovery", runs, dir, nullptr);
  if (live.empty()) return 1;
  fs::remove_all(dir);
  fs::remove(dir.string() + ".log");
  const tb::stats st = tb::summarize(times);
  tb::report rep("supervision");
  const std::string params = "\"runs\": " + std::to_string(runs) + ", \"ranks\": 2, \"hidden\": " + std::to_string(hidden);
  rep.add("restart_resume_s", st.median, "s", params);
  rep.add("live_recovery_s", tb::summarize(live).median, "s", params);
  rep.add("checkpoint_bytes", bytes, "bytes", params);
  rep.print_table();
  return 0;
}
