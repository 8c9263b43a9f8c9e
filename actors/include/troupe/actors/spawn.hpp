#pragma once
/// \file spawn.hpp
/// `spawn(nprocs, fn, args...)` runs `fn(rank, args...)` in `nprocs` forked child processes and
/// joins them. It propagates the first failure (rank, exit code or signal, exception text) and
/// kills the others: the torch.multiprocessing.spawn design. See Note [spawn] in spawn.cpp.
///
/// Fork safety: spawn forks the calling process. Call it before the parent starts threads that
/// hold locks the children need: an actor system, a thread pool, a logger. After fork() only the
/// forking thread exists in the child. A lock held by another parent thread stays held forever
/// there. The child runs only `fn` and then `_exit`s: no static destructors, no atexit handlers
/// of the parent. stdio is flushed before the fork and before the child exits.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "troupe/tensors/error.hpp"

namespace troupe {

/// Options of spawn().
struct spawn_options {
  /// After a failure (and in the destructor), survivors get SIGTERM, then SIGKILL after this.
  std::chrono::milliseconds kill_grace{1000};
};

/// The children of one spawn() call. Move-only RAII: the destructor kills (SIGTERM, then SIGKILL
/// after the grace period) and reaps every child still running, so no zombie or orphan is left.
/// Not thread-safe: use one spawn_context from one thread.
class spawn_context {
 public:
  /// Exit status of a child that threw: the exception's text travels over a pipe beside it.
  static constexpr int exception_exit_code = 1;

  spawn_context(spawn_context&& o) noexcept;
  spawn_context& operator=(spawn_context&& o) noexcept;
  spawn_context(const spawn_context&) = delete;
  spawn_context& operator=(const spawn_context&) = delete;
  ~spawn_context();

  /// Waits up to `timeout` for every child. Returns true when all exited with status 0, false
  /// when the timeout ran out with children still running (they keep running). Blocks the
  /// calling thread. A child may exit non-zero, be killed by a signal, or throw. Then the others
  /// are killed and reaped, and this throws troupe::error naming the rank, pid, exit code or
  /// signal and the exception's text. The code is errc::remote_exception (the child threw) or
  /// errc::peer_lost (non-zero exit, signal). Later calls rethrow the same error.
  bool join(std::chrono::milliseconds timeout = std::chrono::minutes(5));

  /// Waits up to `timeout` until one more child exits. Returns its rank if it succeeded; nullopt
  /// when the timeout ran out or no child is left running. A failed child is handled as in
  /// join() (the others are killed, the error is thrown).
  std::optional<int> wait_any(std::chrono::milliseconds timeout);

  /// The children's pids, indexed by rank (a reaped child's pid may since have been reused).
  std::vector<pid_t> pids() const;
  /// Number of children.
  int nprocs() const noexcept;
  /// Number of children not reaped yet.
  int running() const noexcept;

  /// Sends `sig` to child `rank` if it has not been reaped yet (otherwise does nothing, so a
  /// reused pid is never hit). Throws index_out_of_range for a bad rank, io_error if kill fails.
  void kill(int rank, int sig);

 private:
  friend spawn_context spawn_children(int nprocs, const std::function<void(int)>& fn,
                                      const spawn_options& opts);
  struct child;
  spawn_context();
  void release() noexcept;
  bool reap(child& c);
  std::optional<int> wait_step(std::chrono::steady_clock::time_point deadline);
  [[noreturn]] void fail(const child& c);
  void terminate_all() noexcept;

  std::vector<child> children_;
  spawn_options opts_;
  std::optional<error> failure_;
};

/// Forks `nprocs` children, each running `fn(rank)` then `_exit(0)`. Blocks only for the forks.
/// Throws bad_argument for nprocs < 1. Throws io_error (with errno text) if a pipe or fork
/// fails; the children already forked are then killed and reaped.
spawn_context spawn_children(int nprocs, const std::function<void(int)>& fn, const spawn_options& opts = {});

/// Runs `fn(rank, args...)` in `nprocs` child processes (rank = 0..nprocs-1) and returns their
/// spawn_context; call join() on it. The arguments are copied into each child by fork(), so they
/// need not be serialisable. See spawn_children for errors.
template <class Fn, class... Args>
spawn_context spawn(int nprocs, Fn&& fn, Args&&... args) {
  std::function<void(int)> body = [&fn, &args...](int rank) { std::invoke(fn, rank, args...); };
  return spawn_children(nprocs, body);
}

/// The short name of a signal ("SIGKILL"), or "signal N" for one without a known name.
std::string signal_name(int sig);

}  // namespace troupe
