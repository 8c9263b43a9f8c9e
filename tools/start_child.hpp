#pragma once
// Starting a helper program from a test or an example that watches it (tests/multihost/netns_bed.hpp,
// examples/namespace_hosts.hpp): fork, then exec, the child dying with its parent.

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "troupe/tensors/error.hpp"

namespace troupe::tools {

/// Starts `args` (args[0] a path, not searched for) in a child process that is SIGKILLed when
/// this one dies (PR_SET_PDEATHSIG). Its stdout and stderr go to the file `out` (truncated), or
/// stay this process's when `out` is empty. Returns its pid; the caller reaps it. A child that
/// cannot exec exits with 127. Throws io_error when fork fails.
inline pid_t start_child(const std::vector<std::string>& args, const std::string& out = {}) {
  std::vector<char*> argv;  // built before fork: the child only makes system calls
  for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw error(errc::io_error, "fork failed");
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (!out.empty()) {
      const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

}  // namespace troupe::tools
