#pragma once
// Two hosts made of Linux network namespaces by tools/netns_bed.sh (root). They serve the
// examples that run a job with one troupe-run per host. The bed goes with the object; launchers
// started on it are killed and reaped with it.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "start_child.hpp"  // tools/
#include "troupe/tensors/error.hpp"

namespace troupe::examples {

class namespace_hosts {
 public:
  /// Runs `script up` for `hosts` hosts. available() is false when namespaces cannot be made
  /// here; why() says why.
  namespace_hosts(std::string script, int hosts) : script_(std::move(script)) {
    // gc (run by `up`) deletes a bed named tmh<pid>... once that process is gone.
    prefix_ = "tmh" + std::to_string(::getpid()) + "s";
    const int rc = run("up " + prefix_ + " " + std::to_string(hosts));
    up_ = rc == 0;
    if (rc == 3) why_ = "network namespaces cannot be created here (needs root, iproute2 and netns support)";
    else if (rc != 0) why_ = script_ + " up failed with status " + std::to_string(rc);
  }
  ~namespace_hosts() {
    for (const pid_t p : children_) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
    if (up_) run("down " + prefix_);
  }
  namespace_hosts(const namespace_hosts&) = delete;
  namespace_hosts& operator=(const namespace_hosts&) = delete;

  bool available() const { return up_; }
  const std::string& why() const { return why_; }
  static std::string addr(int host) { return "10.77.0." + std::to_string(host + 1); }
  std::string name(int host) const { return prefix_ + "-h" + std::to_string(host); }

  /// Host `host` drops every packet, both directions (nftables); heal undoes it.
  void cut(int host) {
    if (run("cut " + prefix_ + " " + std::to_string(host) + " >/dev/null") != 0) throw error(errc::io_error, "cannot cut " + name(host));
  }
  void heal(int host) { run("heal " + prefix_ + " " + std::to_string(host)); }

  /// Starts `argv` on `host` (its output goes to this process's); returns its pid.
  pid_t start(int host, const std::vector<std::string>& argv) {
    std::vector<std::string> args{script_, "exec", prefix_, std::to_string(host)};
    args.insert(args.end(), argv.begin(), argv.end());
    const pid_t pid = tools::start_child(args);
    children_.push_back(pid);
    return pid;
  }
  /// The exit code of a started process once it ended (128 + signal), or -1 while it runs.
  int poll_exit(pid_t pid) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) != pid) return -1;
    std::erase(children_, pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  int run(const std::string& args) const {
    std::fflush(nullptr);
    const int st = std::system(("'" + script_ + "' " + args).c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
  }

  std::string script_;
  std::string prefix_;
  bool up_ = false;
  std::string why_;
  std::vector<pid_t> children_;
};

}  // namespace troupe::examples
