#pragma once
// Helpers of the ddp tests:
// - run a function on N spawned ranks, each with its own process group; the rendezvous goes
//   through a file_store, so no runtime node is needed;
// - a pipe that carries small results from the children to the parent;
// - a free loopback port.
// Children report failures by throwing (spawn's join rethrows the text).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include <catch2/catch.hpp>

#include "troupe/actors/spawn.hpp"
#include "troupe/ddp/file_store.hpp"
#include "troupe/ddp/process_group.hpp"
#include "troupe/tensors/factories.hpp"

#include "sanitizer_build.hpp"

#if TROUPE_TEST_ASAN
#include <sanitizer/lsan_interface.h>
#endif

namespace troupe::test {

/// Throws bad_argument with `what` unless `cond` (assertions inside children).
inline void expect(bool cond, const std::string& what) {
  if (!cond) throw error(errc::bad_argument, "check failed: " + what);
}

/// Under ASan, runs LeakSanitizer inside a spawned child before it `_exit`s, and fails the rank
/// when something leaked; the report goes to stderr. An `_exit` skips the at-exit leak check, so
/// the ddp code that runs only in children would never be checked. A no-op in other builds.
inline void check_child_leaks(int rank) {
#if TROUPE_TEST_ASAN
  if (__lsan_do_recoverable_leak_check() != 0)
    throw error(errc::invalid_state, "rank " + std::to_string(rank) + " leaked memory (LeakSanitizer report on stderr)");
#else
  (void)rank;
#endif
}

using group_fn = std::function<void(int, const ddp::file_store&, ddp::process_group&)>;

/// A fresh store directory, removed at scope exit.
struct temp_store {
  ddp::file_store store = ddp::file_store::make_temp();
  temp_store() = default;
  temp_store(const temp_store&) = delete;
  temp_store& operator=(const temp_store&) = delete;
  ~temp_store() { store.remove_dir(); }
};

/// Runs fn(rank, store, group) on `world` spawned ranks; returns the spawn context (not joined).
inline spawn_context spawn_group(const temp_store& dir, int world, group_fn fn, ddp::process_group_options opts = {}) {
  const ddp::file_store store = dir.store;
  return spawn(world, [store, world, fn, opts](int rank) {
    {
      ddp::process_group pg(store, rank, world, "test", opts);
      fn(rank, store, pg);
    }
    check_child_leaks(rank);
  });
}

/// spawn_group + join: throws the first child's failure; false when it ran past `timeout`.
inline bool run_group(int world, group_fn fn, ddp::process_group_options opts = {},
                      std::chrono::milliseconds timeout = std::chrono::seconds(90)) {
  temp_store dir;
  auto ctx = spawn_group(dir, world, std::move(fn), opts);
  return ctx.join(timeout);
}

/// A pipe made before spawn: children write fixed-size records, the parent reads them with a
/// timeout.
template <class Record>
class result_pipe {
 public:
  result_pipe() {
    if (::pipe(fds_) != 0) throw error(errc::io_error, "pipe() failed");
  }
  ~result_pipe() {
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  result_pipe(const result_pipe&) = delete;
  result_pipe& operator=(const result_pipe&) = delete;

  void write(const Record& r) {
    if (::write(fds_[1], &r, sizeof(r)) != static_cast<ssize_t>(sizeof(r))) throw error(errc::io_error, "result pipe write");
  }
  Record read(std::chrono::milliseconds timeout) {
    pollfd p{fds_[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) throw error(errc::timeout, "no result from a child");
    Record r{};
    if (::read(fds_[0], &r, sizeof(r)) != static_cast<ssize_t>(sizeof(r))) throw error(errc::io_error, "result pipe read");
    return r;
  }

 private:
  int fds_[2] = {-1, -1};
};


/// What a surviving rank saw after a peer was SIGKILLed.
struct loss_report {
  int rank = -1;
  int code = 0;      ///< errc of the error it got (0: none)
  double ms = -1;    ///< from the kill to that error
  char text[300] = {};
};

/// Measures SIGKILL -> error across forked ranks (the peer-loss tests). The victim stamps the
/// kill time into a shared page right before it dies. Each survivor reports the error its `fn`
/// threw and how long after the kill. Create it in the parent before spawning; RAII over the page.
class peer_loss_probe {
 public:
  peer_loss_probe()
      : kill_ns_(static_cast<std::atomic<std::int64_t>*>(
            ::mmap(nullptr, sizeof(std::int64_t), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0))) {
    if (kill_ns_ == MAP_FAILED) throw error(errc::io_error, "peer_loss_probe: mmap failed");
  }
  ~peer_loss_probe() { ::munmap(kill_ns_, sizeof(std::int64_t)); }
  peer_loss_probe(const peer_loss_probe&) = delete;
  peer_loss_probe& operator=(const peer_loss_probe&) = delete;

  /// In the victim: stamps the time and dies by SIGKILL.
  [[noreturn]] void kill_self() {
    kill_ns_->store(now_ns());
    ::raise(SIGKILL);
    ::_exit(99);  // not reached
  }
  /// In a survivor: runs `fn` and reports what it threw (code 0 if nothing).
  void report(int rank, const std::function<void()>& fn) {
    loss_report r;
    r.rank = rank;
    try {
      fn();
    } catch (const error& e) {
      r.code = static_cast<int>(e.code());
      r.ms = static_cast<double>(now_ns() - kill_ns_->load()) / 1e6;
      std::strncpy(r.text, e.message().c_str(), sizeof(r.text) - 1);
    }
    results_.write(r);
  }
  /// In the parent: the next survivor's report.
  loss_report read(std::chrono::milliseconds timeout) { return results_.read(timeout); }

 private:
  static std::int64_t now_ns() { return std::chrono::steady_clock::now().time_since_epoch().count(); }
  std::atomic<std::int64_t>* kill_ns_;
  result_pipe<loss_report> results_;
};

/// In the parent: reads `survivors` reports and checks that each got peer_lost naming
/// "rank <victim>" within 2 s of the kill (the measured time is printed).
inline void check_peer_lost(peer_loss_probe& probe, int survivors, int victim, const char* what) {
  for (int i = 0; i < survivors; ++i) {
    const loss_report r = probe.read(std::chrono::seconds(20));
    INFO(what << ", rank " << r.rank << ": " << r.text);
    CHECK(r.code == static_cast<int>(errc::peer_lost));
    CHECK(std::string(r.text).find("rank " + std::to_string(victim)) != std::string::npos);
    CHECK(r.ms >= 0.0);
    CHECK(r.ms < 2000.0);
    WARN(what << ": peer_lost " << r.ms << " ms after the SIGKILL, on rank " << r.rank);
  }
}

/// Rank body of the size-mismatch tests (every transport): rank 1 allreduces 20 elements, the
/// others 10. Every rank must fail with collective_mismatch naming rank 1 and both sizes. The
/// group must stay usable: the next allreduce of 3 ranks sums to 3.
inline void expect_size_mismatch_reported(int rank, ddp::process_group& pg) {
  tensor t = ones({rank == 1 ? 20 : 10});
  bool failed = false;
  try {
    pg.allreduce(t).wait(std::chrono::seconds(10));
  } catch (const error& e) {
    failed = true;
    expect(e.code() == errc::collective_mismatch, "code is collective_mismatch, got " + std::string(e.what()));
    const std::string m = e.message();
    expect(m.find("rank 1") != std::string::npos && m.find("numel 20") != std::string::npos &&
               m.find("numel 10") != std::string::npos,
           "message names the rank and both sizes: " + m);
  }
  expect(failed, "the mismatched allreduce failed");
  tensor ok = ones({5});
  pg.allreduce(ok).wait(std::chrono::seconds(10));
  expect(ok.data<float>()[0] == 3.0f, "next allreduce sums");
}

/// Rank body of the monitored-barrier tests (every transport, 3 ranks). Rank 2 arrives only
/// after ranks 0 and 1 timed out. Each of them must get `timeout` with a message containing
/// `names_rank_2`. Every rank stays until the others are done (an early exit looks like a death).
inline void expect_late_rank_named(int rank, const ddp::file_store& st, ddp::process_group& pg, const std::string& names_rank_2) {
  using std::chrono::seconds;
  if (rank == 2) {
    st.get("late/done0", seconds(20));
    st.get("late/done1", seconds(20));
    return;
  }
  try {
    pg.monitored_barrier(std::chrono::milliseconds(300));
    expect(false, "the barrier should time out");
  } catch (const error& e) {
    expect(e.code() == errc::timeout, "timeout, got " + std::string(e.what()));
    expect(e.message().find(names_rank_2) != std::string::npos, "names rank 2: " + e.message());
  }
  st.set("late/done" + std::to_string(rank), "1");
  st.get("late/done" + std::to_string(1 - rank), seconds(20));
}

/// A loopback port that was free a moment ago (the launcher picks MASTER_PORT the same way).
inline std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw error(errc::io_error, "free_port: no loopback port");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

}  // namespace troupe::test
