#pragma once
// Helpers of the stall tests. The parent freezes a rank (SIGSTOP, confirmed by waitpid) and
// stamps the moment in a shared page. The ranks report what they saw, and when, over a pipe.
// Every wait is bounded.

#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>

#include "troupe/tensors/error.hpp"

namespace troupe::test {

/// What a rank saw.
struct stall_report {
  int rank = -1;
  int code = 0;     ///< errc of the error it got (0: none)
  double ms = -1;   ///< from the stamp to that outcome
  int count = 0;    ///< test-specific (failed calls seen, ...)
  bool ok = false;  ///< test-specific (the call after the stall succeeded, ...)
  char text[400] = {};
};

/// A shared time stamp and a report pipe. Create it in the parent before spawning.
class stall_probe {
 public:
  stall_probe()
      : stamp_(static_cast<std::atomic<std::int64_t>*>(
            ::mmap(nullptr, sizeof(std::int64_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0))) {
    if (stamp_ == MAP_FAILED) throw error(errc::io_error, "stall_probe: mmap failed");
    if (::pipe(fds_) != 0) throw error(errc::io_error, "stall_probe: pipe failed");
  }
  ~stall_probe() {
    ::munmap(stamp_, sizeof(std::int64_t));
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  stall_probe(const stall_probe&) = delete;
  stall_probe& operator=(const stall_probe&) = delete;

  /// Records now as the moment every report is measured from.
  void stamp() { stamp_->store(now_ns()); }
  /// Milliseconds since the stamp (negative before it).
  double ms_since() const { return static_cast<double>(now_ns() - stamp_->load()) / 1e6; }

  /// In a rank: sends a report.
  void report(const stall_report& r) {
    if (::write(fds_[1], &r, sizeof(r)) != static_cast<ssize_t>(sizeof(r))) throw error(errc::io_error, "stall_probe: write");
  }
  /// In a rank: reports `e` (or success) measured from the stamp.
  void report_outcome(int rank, const error* e, int count = 0, bool ok = false) {
    stall_report r;
    r.rank = rank;
    r.ms = ms_since();
    r.count = count;
    r.ok = ok;
    if (e) {
      r.code = static_cast<int>(e->code());
      std::strncpy(r.text, e->message().c_str(), sizeof(r.text) - 1);
    }
    report(r);
  }
  /// In the parent: the next report.
  stall_report read(std::chrono::milliseconds timeout) {
    pollfd p{fds_[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) throw error(errc::timeout, "stall_probe: no report from a rank");
    stall_report r;
    if (::read(fds_[0], &r, sizeof(r)) != static_cast<ssize_t>(sizeof(r))) throw error(errc::io_error, "stall_probe: read");
    return r;
  }

 private:
  static std::int64_t now_ns() { return std::chrono::steady_clock::now().time_since_epoch().count(); }
  std::atomic<std::int64_t>* stamp_;
  int fds_[2] = {-1, -1};
};

/// Stops `pid` and waits until it is stopped (kill() only queues the stop); true on success.
inline bool freeze(pid_t pid) {
  if (::kill(pid, SIGSTOP) != 0) return false;
  int status = 0;
  return ::waitpid(pid, &status, WUNTRACED) == pid && WIFSTOPPED(status);
}

}  // namespace troupe::test
