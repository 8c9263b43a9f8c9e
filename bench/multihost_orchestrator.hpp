#pragma once
// The orchestrator of multihost_bench: makes a 2-host test bed (tools/netns_bed.sh), runs the
// roles on their hosts (this binary with --role), bounded, and reports the metrics they print.

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.hpp"

namespace troupe::bench::mh {

/// A process on a namespace host, output to a file; killed and reaped by the destructor.
struct host_run {
  pid_t pid = -1;
  std::string out;
  host_run(pid_t p, std::string o) : pid(p), out(std::move(o)) {}
  host_run(host_run&& o) noexcept : pid(o.pid), out(std::move(o.out)) { o.pid = -1; }
  host_run(const host_run&) = delete;
  ~host_run() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    if (!out.empty()) std::remove(out.c_str());
  }
  /// Waits up to `timeout` for the exit; true when it exited.
  bool wait(std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (pid > 0 && std::chrono::steady_clock::now() < end) {
      if (::waitpid(pid, nullptr, WNOHANG) == pid) pid = -1;
      else std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pid < 0;
  }
  std::string output() const {
    std::ifstream in(out);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
};

/// A 2-host bed for the run's lifetime.
class bench_bed {
 public:
  bench_bed() : prefix_("tmh" + std::to_string(::getpid()) + "b") { up_ = script("up " + prefix_ + " 2") == 0; }
  ~bench_bed() {
    if (up_) script("down " + prefix_);
  }
  bench_bed(const bench_bed&) = delete;
  bench_bed& operator=(const bench_bed&) = delete;
  bool up() const { return up_; }
  void cut(int h) { script("cut " + prefix_ + " " + std::to_string(h)); }
  void heal(int h) { script("heal " + prefix_ + " " + std::to_string(h)); }
  std::string marks() const {
    const std::string d = "/tmp/" + prefix_ + "-marks";
    ::mkdir(d.c_str(), 0755);
    return d;
  }

  host_run start(int host, std::vector<std::string> argv, const std::vector<std::string>& env) {
    static int seq = 0;
    const std::string out = "/tmp/" + prefix_ + "-" + std::to_string(seq++) + ".txt";
    std::vector<std::string> a{TROUPE_NETNS_BED, "exec", prefix_, std::to_string(host), "env"};
    a.insert(a.end(), env.begin(), env.end());
    a.insert(a.end(), argv.begin(), argv.end());
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> args;
      for (auto& s : a) args.push_back(s.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    return host_run(pid, out);
  }

 private:
  static int script(const std::string& args) {
    const int st = std::system((std::string(TROUPE_NETNS_BED) + " " + args + " >/dev/null 2>&1").c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  }
  std::string prefix_;
  bool up_ = false;
};

/// Adds every "M <metric> <value> <unit> <params>" line of `text` to `rep`; false when none.
inline bool collect(report& rep, const std::string& text) {
  std::istringstream in(text);
  std::string line;
  bool any = false;
  while (std::getline(in, line)) {
    if (line.rfind("M ", 0) != 0) continue;
    std::istringstream l(line.substr(2));
    std::string metric, unit, params;
    double value = 0;
    l >> metric >> value >> unit;
    std::getline(l, params);
    if (!params.empty() && params.front() == ' ') params.erase(0, 1);
    rep.add(metric, value, unit, params);
    any = true;
  }
  return any;
}

/// The launcher variables of rank `rank` of `world` whose rank 0 is on host 0 at `port`.
inline std::vector<std::string> rank_env(int rank, int world, int port) {
  return {"RANK=" + std::to_string(rank), "WORLD_SIZE=" + std::to_string(world), "MASTER_ADDR=10.77.0.1",
          "MASTER_PORT=" + std::to_string(port), "TROUPE_JOB_TOKEN=mh-bench"};
}

}  // namespace troupe::bench::mh
