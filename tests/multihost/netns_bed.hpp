#pragma once
// The multi-host test bed in C++: namespace hosts made by tools/netns_bed.sh, processes started
// on them, and the cuts and freezes of the partition tests. RAII throughout: a bed deletes its
// namespaces (and stops what runs in them) when it goes; a host_process is killed and reaped.
// Where namespaces cannot be created, require_bed() prints why and ends the test binary with
// exit code 77, which CTest reports as skipped.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "start_child.hpp"  // tools/
#include "troupe/tensors/error.hpp"

namespace troupe::test {

/// Milliseconds since the epoch (the same clock in every namespace of this machine).
inline long long wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// A process on a namespace host; its stdout and stderr go to a file. Move-only; the destructor
/// kills (SIGKILL) and reaps it if it still runs.
class host_process {
 public:
  host_process(pid_t pid, std::string out) : pid_(pid), out_(std::move(out)) {}
  host_process(host_process&& o) noexcept : pid_(o.pid_), code_(o.code_), out_(std::move(o.out_)) { o.pid_ = -1; }
  host_process& operator=(host_process&&) = delete;
  host_process(const host_process&) = delete;
  ~host_process() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (!out_.empty()) std::remove(out_.c_str());
  }

  /// Waits up to `timeout` for the exit; returns the exit code (128 + signal), or -1 when it
  /// still runs at the deadline.
  int wait(std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (pid_ > 0) {
      int status = 0;
      const pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        break;
      }
      if (std::chrono::steady_clock::now() >= end) return -1;
      ::usleep(5000);  // polling a child's exit, not synchronising with it
    }
    return code_;
  }
  /// Sends `sig` if it still runs.
  void signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  /// What it printed so far.
  std::string output() const {
    std::ifstream in(out_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }

 private:
  pid_t pid_;
  int code_ = -1;
  std::string out_;
};

/// N namespace hosts at 10.77.0.1..N on one bridge. Hosts are named <prefix>-h<i>.
class netns_bed {
 public:
  explicit netns_bed(int hosts) : hosts_(hosts) {
    static int count = 0;  // several beds in one process get different names
    prefix_ = "tmh" + std::to_string(::getpid()) + static_cast<char>('a' + (count++ % 26));
    const int rc = script("up " + prefix_ + " " + std::to_string(hosts));
    up_ = rc == 0;
    skippable_ = rc == 3;
    if (rc == 3) why_ = "network namespaces cannot be created here (needs root, iproute2 and netns support)";
    else if (rc != 0) why_ = "netns_bed.sh up failed with status " + std::to_string(rc);
  }
  ~netns_bed() {
    if (up_) script("down " + prefix_);
  }
  netns_bed(const netns_bed&) = delete;
  netns_bed& operator=(const netns_bed&) = delete;

  bool available() const { return up_; }
  /// True when the bed is missing because this machine cannot make namespaces (not a failure).
  bool skippable() const { return skippable_; }
  const std::string& why() const { return why_; }
  const std::string& prefix() const { return prefix_; }
  static std::string addr(int host) { return "10.77.0." + std::to_string(host + 1); }
  std::string host_name(int host) const { return prefix_ + "-h" + std::to_string(host); }

  /// Host `host` drops every packet on its interface, both directions (nftables). Returns the
  /// wall-clock millisecond (wall_ms) at which the rules went in, after the script's start-up.
  long long cut(int host) { return must_at("cut " + prefix_ + " " + std::to_string(host)); }
  void heal(int host) { must("heal " + prefix_ + " " + std::to_string(host)); }
  /// A cut of `host` that lasts `length`, timed inside the host's namespace.
  void blip(int host, std::chrono::milliseconds length) {
    must("blip " + prefix_ + " " + std::to_string(host) + " " + std::to_string(length.count()));
  }
  /// SIGSTOP / SIGCONT to every process on `host`. freeze returns the wall-clock millisecond
  /// (wall_ms) at which the signals were sent.
  long long freeze(int host) { return must_at("freeze " + prefix_ + " " + std::to_string(host)); }
  void thaw(int host) { must("thaw " + prefix_ + " " + std::to_string(host)); }

  /// Starts `argv` on `host` with `env` (NAME=value) added; output goes to a file.
  host_process start(int host, const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
    static int seq = 0;
    const std::string out = "/tmp/" + prefix_ + "-out" + std::to_string(seq++) + ".txt";
    std::vector<std::string> args{TROUPE_NETNS_BED, "exec", prefix_, std::to_string(host), "env"};
    args.insert(args.end(), env.begin(), env.end());
    args.insert(args.end(), argv.begin(), argv.end());
    return host_process(tools::start_child(args, out), out);
  }

 private:
  static int script(const std::string& args) {
    const int st = std::system((std::string(TROUPE_NETNS_BED) + " " + args).c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  }
  void must(const std::string& args) {
    if (script(args) != 0) throw error(errc::io_error, "netns_bed.sh " + args + " failed");
  }
  // Runs the script and returns the number it printed last (a wall-clock millisecond).
  static long long must_at(const std::string& args) {
    std::fflush(nullptr);
    FILE* p = ::popen((std::string(TROUPE_NETNS_BED) + " " + args).c_str(), "r");
    if (!p) throw error(errc::io_error, "netns_bed.sh " + args + ": popen failed");
    long long at = -1;
    char line[128];
    while (std::fgets(line, sizeof line, p)) at = std::atoll(line);
    const int st = ::pclose(p);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || at <= 0) throw error(errc::io_error, "netns_bed.sh " + args + " failed");
    return at;
  }

  int hosts_;
  std::string prefix_;
  bool up_ = false;
  bool skippable_ = false;
  std::string why_;
};

/// Ends the test binary as skipped (exit 77) when this machine cannot make namespaces; throws
/// io_error (the test fails) when it can but the bed did not come up.
inline void require_bed(const netns_bed& bed) {
  if (bed.available()) return;
  if (!bed.skippable()) throw error(errc::io_error, "the multi-host test bed did not come up: " + bed.why());
  std::fprintf(stderr, "SKIPPED: multi-host tests need network namespaces: %s\n", bed.why().c_str());
  std::fflush(nullptr);
  std::_Exit(77);
}

/// Starts `argv` in this process's namespaces with `env` (NAME=value) added; output goes to a
/// file. For programs that make their own bed or play a host on loopback.
inline host_process start_here(const std::vector<std::string>& argv, const std::vector<std::string>& env = {}) {
  static int seq = 0;
  const std::string out = "/tmp/troupe-mh-" + std::to_string(::getpid()) + "-here" + std::to_string(seq++) + ".txt";
  std::vector<std::string> args{"/usr/bin/env"};
  args.insert(args.end(), env.begin(), env.end());
  args.insert(args.end(), argv.begin(), argv.end());
  return host_process(tools::start_child(args, out), out);
}

/// The path of this test binary (ranks run it with a hidden tag).
inline std::string self_exe() {
  char buf[4096];
  const auto n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw error(errc::io_error, "cannot read /proc/self/exe");
  return std::string(buf, static_cast<std::size_t>(n));
}

}  // namespace troupe::test
