// spawn(): success, failure propagation (exception text, exit code, signal), killing the others,
// timeouts, and no child left behind.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <stdexcept>
#include <string>

#include "sanitizer_build.hpp"
#include "troupe/actors/spawn.hpp"


using namespace std::chrono_literals;

namespace {

// A few integers shared by the parent and its forked children (anonymous shared mapping).
class shared_slots {
 public:
  explicit shared_slots(std::size_t n) : n_(n) {
    void* p = ::mmap(nullptr, n * sizeof(std::atomic<long>), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    slots_ = static_cast<std::atomic<long>*>(p);
    for (std::size_t i = 0; i < n; ++i) slots_[i].store(-1);
  }
  shared_slots(const shared_slots&) = delete;
  shared_slots& operator=(const shared_slots&) = delete;
  ~shared_slots() { ::munmap(slots_, n_ * sizeof(std::atomic<long>)); }
  std::atomic<long>& operator[](std::size_t i) const { return slots_[i]; }

 private:
  std::size_t n_;
  std::atomic<long>* slots_;
};

// A pipe the parent writes to release children blocked in wait_for_go().
class go_pipe {
 public:
  go_pipe() { REQUIRE(::pipe(fds_) == 0); }
  go_pipe(const go_pipe&) = delete;
  go_pipe& operator=(const go_pipe&) = delete;
  ~go_pipe() { ::close(fds_[0]); ::close(fds_[1]); }
  void release(int n = 1) const {
    for (int i = 0; i < n; ++i)
      if (::write(fds_[1], "g", 1) != 1) throw std::runtime_error("go_pipe: write failed");
  }
  // Blocks until released once (bounded: throws after 30 s).
  void wait_for_go() const {
    pollfd pfd{fds_[0], POLLIN, 0};
    if (::poll(&pfd, 1, 30000) != 1) throw std::runtime_error("go_pipe: not released within 30 s");
    char c = 0;
    if (::read(fds_[0], &c, 1) != 1) throw std::runtime_error("go_pipe: read failed");
  }

 private:
  int fds_[2];
};

// A child body that never returns by itself (bounded: exits after 60 s).
[[noreturn]] void block_forever(int /*rank*/) {
  ::sleep(60);
  ::_exit(42);
}

bool process_gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// Waits up to `timeout` until `pid` (not necessarily our child) has exited.
bool wait_exit_of(pid_t pid, std::chrono::milliseconds timeout) {
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) return errno == ESRCH;
  pollfd pfd{pidfd, POLLIN, 0};
  const bool exited = ::poll(&pfd, 1, static_cast<int>(timeout.count())) == 1;
  ::close(pidfd);
  return exited;
}

// Allocates and drops a few blocks in a frame of its own. So no stale register or stack slot of
// the caller still points at them when the leak check runs.
__attribute__((noinline)) void leak_some() {
  for (int i = 0; i < 10; ++i) {
    auto* lost = new char[100];
    asm volatile("" : : "g"(lost) : "memory");  // the allocation happens; its address is then dropped
  }
}

troupe::error join_error(troupe::spawn_context& ctx) {
  try {
    ctx.join(30s);
  } catch (const troupe::error& e) {
    return e;
  }
  FAIL("join did not throw");
  return troupe::error(troupe::errc::ok, "");
}

}  // namespace

TEST_CASE("spawn runs fn with each rank and the extra arguments and join reports success", "[actors][integration]") {
  shared_slots slots(4);
  auto ctx = troupe::spawn(
      4, [&slots](int rank, long base, const std::string& tag) { slots[rank].store(base + rank + static_cast<long>(tag.size())); },
      100L, std::string("abc"));
  CHECK(ctx.nprocs() == 4);
  REQUIRE(ctx.join(30s));
  for (int r = 0; r < 4; ++r) CHECK(slots[r].load() == 103 + r);
  CHECK(ctx.running() == 0);
  for (pid_t pid : ctx.pids()) CHECK(process_gone(pid));
}

TEST_CASE("an exception thrown in a child reaches join with its rank, type and text", "[actors][integration]") {
  auto ctx = troupe::spawn(3, [](int rank) {
    if (rank == 1) throw std::invalid_argument("bad shard index 17 on rank 1");
  });
  const troupe::error e = join_error(ctx);
  CHECK(e.code() == troupe::errc::remote_exception);
  CHECK_THAT(e.message(), Catch::Contains("rank 1"));
  CHECK_THAT(e.message(), Catch::Contains("std::invalid_argument"));
  CHECK_THAT(e.message(), Catch::Contains("bad shard index 17 on rank 1"));
  // A second join reports the same failure.
  CHECK_THROWS_WITH(ctx.join(1s), Catch::Contains("bad shard index 17"));
}

TEST_CASE("a child's non-zero exit code is reported with its rank", "[actors][integration]") {
  auto ctx = troupe::spawn(2, [](int rank) {
    if (rank == 0) ::_exit(3);
  });
  const troupe::error e = join_error(ctx);
  CHECK(e.code() == troupe::errc::peer_lost);
  CHECK_THAT(e.message(), Catch::Contains("rank 0"));
  CHECK_THAT(e.message(), Catch::Contains("exited with code 3"));
}

TEST_CASE("a child killed by SIGKILL is reported with the signal's name", "[actors][integration]") {
  auto ctx = troupe::spawn(2, [](int rank) {
    if (rank == 1) ::raise(SIGKILL);
  });
  const troupe::error e = join_error(ctx);
  CHECK(e.code() == troupe::errc::peer_lost);
  CHECK_THAT(e.message(), Catch::Contains("rank 1"));
  CHECK_THAT(e.message(), Catch::Contains("SIGKILL"));
}

TEST_CASE("when one child fails the others are killed and reaped before join throws", "[actors][integration]") {
  go_pipe started;
  go_pipe ready;
  troupe::spawn_options opts;
  opts.kill_grace = 300ms;
  auto ctx = troupe::spawn_children(
      3,
      [&](int rank) {
        if (rank == 2) ::signal(SIGTERM, SIG_IGN);  // must be SIGKILLed after the grace period
        if (rank > 0) {
          ready.release();
          block_forever(rank);
        }
        started.wait_for_go();
        throw std::runtime_error("rank 0 gives up");
      },
      opts);
  ready.wait_for_go();
  ready.wait_for_go();  // both survivors run (rank 2 ignores SIGTERM) before rank 0 fails
  started.release();
  const auto t0 = std::chrono::steady_clock::now();
  const troupe::error e = join_error(ctx);
  CHECK(std::chrono::steady_clock::now() - t0 < 20s);
  CHECK(e.code() == troupe::errc::remote_exception);
  CHECK_THAT(e.message(), Catch::Contains("rank 0 gives up"));
  CHECK(ctx.running() == 0);
  for (pid_t pid : ctx.pids()) CHECK(process_gone(pid));
}

TEST_CASE("join with a timeout returns false while a child runs and the destructor reaps it", "[actors][integration]") {
  pid_t pid = -1;
  {
    auto ctx = troupe::spawn(1, block_forever);
    pid = ctx.pids().at(0);
    CHECK_FALSE(ctx.join(100ms));
    CHECK(ctx.running() == 1);
    CHECK(::kill(pid, 0) == 0);
  }
  CHECK(process_gone(pid));  // neither running nor a zombie
  CHECK(::waitpid(pid, nullptr, WNOHANG) == -1);
}

TEST_CASE("wait_any returns the rank of the child that finished first", "[actors][integration]") {
  go_pipe go;
  auto ctx = troupe::spawn(2, [&go](int rank) {
    if (rank == 0) go.wait_for_go();
  });
  CHECK(ctx.wait_any(30s) == std::optional<int>(1));
  CHECK(ctx.running() == 1);
  CHECK_FALSE(ctx.wait_any(50ms).has_value());
  go.release();
  CHECK(ctx.wait_any(30s) == std::optional<int>(0));
  CHECK(ctx.join(1s));
}

TEST_CASE("a signal sent with kill(rank) fails the join naming that signal", "[actors][integration]") {
  auto ctx = troupe::spawn(2, block_forever);
  ctx.kill(1, SIGTERM);
  const troupe::error e = join_error(ctx);
  CHECK(e.code() == troupe::errc::peer_lost);
  CHECK_THAT(e.message(), Catch::Contains("rank 1") && Catch::Contains("SIGTERM"));
  CHECK_THROWS_AS(ctx.kill(5, SIGTERM), troupe::error);
}

TEST_CASE("spawn refuses a non-positive process count", "[actors][integration]") {
  CHECK_THROWS_WITH(troupe::spawn(0, [](int) {}), Catch::Contains("nprocs"));
}

TEST_CASE("a grandchild dies with the child that spawned it", "[actors][integration]") {
  // Orphans come to this process (not to init), so the test can reap the grandchild itself.
  REQUIRE(::prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
  shared_slots grandchild(1);
  go_pipe go;
  go_pipe stored;
  auto ctx = troupe::spawn(1, [&](int) {
    auto inner = troupe::spawn(1, block_forever);
    grandchild[0].store(inner.pids().at(0));
    stored.release();
    go.wait_for_go();
    ::raise(SIGKILL);  // no destructor runs: only PR_SET_PDEATHSIG can stop the grandchild
  });
  stored.wait_for_go();
  const pid_t gpid = static_cast<pid_t>(grandchild[0].load());
  REQUIRE(gpid > 0);
  go.release();
  CHECK_THROWS_WITH(ctx.join(30s), Catch::Contains("SIGKILL"));
  CHECK(wait_exit_of(gpid, 10s));
  int status = 0;
  CHECK(::waitpid(gpid, &status, WNOHANG) == gpid);
  // SIGKILL from PR_SET_PDEATHSIG, or 127 when the child died before the grandchild's prctl ran.
  INFO("grandchild wait status " << status);
  CHECK(((WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) || (WIFEXITED(status) && WEXITSTATUS(status) == 127)));
  ::prctl(PR_SET_CHILD_SUBREAPER, 0);
}

TEST_CASE("a spawned child that leaks fails under LeakSanitizer and passes without it", "[actors][integration]") {
  // Note [leak check in children]: a child's _exit skips LeakSanitizer's check at exit, so spawn
  // runs it first in a sanitizer build.
  auto ctx = troupe::spawn(1, [](int) { leak_some(); });
#if TROUPE_TEST_ASAN
  const troupe::error e = join_error(ctx);
  CHECK(e.code() == troupe::errc::peer_lost);
  CHECK_THAT(e.message(), Catch::Contains("exited with code 23"));
#else
  CHECK(ctx.join(30s));
#endif
}
