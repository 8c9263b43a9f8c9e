#pragma once
// Child processes for tests that use CUDA in the children. CUDA does not survive fork(): a child
// forked after the parent touched CUDA (a device count is enough) cannot use the device. So the
// child is a fresh process: fork, then exec this same test executable running one hidden test.
// That test is tagged [.], named without commas or brackets, and reads its rank and parameters
// from the environment. spawn_children's guarantees hold: the parent's death kills the child,
// and join() reports a failed child. A child's Catch2 run exits non-zero when an assertion failed.

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "troupe/actors/spawn.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::test {

/// Starts `n` children, child c running only the hidden test `test_name` of this executable
/// with TROUPE_TEST_CHILD=c+1 and `env` in its environment; `quiet` sends their output to
/// /dev/null. Throws what spawn_children throws.
inline spawn_context exec_children(int n, const std::string& test_name, const std::map<std::string, std::string>& env = {},
                                   bool quiet = false) {
  return spawn_children(n, [test_name, env, quiet](int c) {
    if (quiet) {
      const int null = ::open("/dev/null", O_WRONLY);
      if (null >= 0) {
        ::dup2(null, STDOUT_FILENO);
        ::dup2(null, STDERR_FILENO);
      }
    }
    ::setenv("TROUPE_TEST_CHILD", std::to_string(c + 1).c_str(), 1);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::string exe = "/proc/self/exe", name = test_name;
    std::vector<char*> argv{exe.data(), name.data(), nullptr};
    ::execv(exe.c_str(), argv.data());
    throw error(errc::io_error, "exec of the test executable for '" + test_name + "' failed");
  });
}

/// In a child of exec_children: its rank (1..n); 0 in a test that is not such a child.
inline int child_rank() {
  const char* v = std::getenv("TROUPE_TEST_CHILD");
  return v == nullptr ? 0 : std::atoi(v);
}

/// In a child: the value of `name` that the parent passed; throws bad_argument when absent.
inline std::string child_env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) throw error(errc::bad_argument, std::string("test child: ") + name + " is not set");
  return v;
}

}  // namespace troupe::test
