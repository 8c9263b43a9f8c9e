#pragma once
// Helpers shared by the libFuzzer harnesses of fuzz/ (Note [fuzz harnesses] in fuzz/README.md).

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "troupe/tensors/error.hpp"

namespace troupe::fuzz {

/// The fuzzer's bytes as a file that the path-based readers open: a memfd, read through its
/// /proc/self/fd path (no disk, nothing left behind).
class memory_file {
 public:
  memory_file(const std::uint8_t* data, std::size_t n) : fd_(::memfd_create("troupe_fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) std::abort();
    for (std::size_t done = 0; done < n;) {
      const ssize_t k = ::write(fd_, data + done, n - done);
      if (k <= 0) std::abort();
      done += static_cast<std::size_t>(k);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~memory_file() { ::close(fd_); }
  memory_file(const memory_file&) = delete;
  memory_file& operator=(const memory_file&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

/// Runs `f`. A troupe::error is how a decoder refuses bad input, so it is swallowed; any other
/// exception escapes the harness and libFuzzer reports it as a finding.
template <class F>
void refused_ok(F&& f) {
  try {
    f();
  } catch (const troupe::error&) {
  }
}

/// A property every input must keep (two decoders agree, a round trip holds): aborts with `what`
/// otherwise, which libFuzzer reports as a crash with this input.
inline void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz property violated: %s\n", what);
  std::abort();
}

}  // namespace troupe::fuzz
