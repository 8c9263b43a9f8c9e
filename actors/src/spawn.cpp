// spawn(): forked children with failure propagation. See Note [spawn].
//
// Note [spawn]
// ~~~~~~~~~~~~
// spawn_children(n, fn) flushes stdio and forks n children. Each child gets one pipe, the
// "error pipe": write end in the child, non-blocking read end in the parent. In the parent,
// each child also gets a pidfd (pidfd_open) that becomes readable when the child exits.
//
//   parent                                   child r
//   ------                                   -------
//   pipe2, fork  ------------------------->  prctl(PR_SET_PDEATHSIG, SIGKILL)
//   close write end                          (parent already gone? _exit(127))
//   pidfd_open(pid)                          fn(r)
//                                            threw? write "type: what()" into the pipe, status 1
//   join(): poll(pidfds + pipes) <---------  fflush; _exit(status)
//           drain pipes, waitpid(WNOHANG)
//
// States of a child: running -> exited(status 0) | failed(status != 0, signal, exception).
// join/wait_any poll every running child's pidfd and error pipe until the deadline. A readable
// pipe is drained, so a long message never blocks the child. A readable pidfd is reaped with
// waitpid. The first failure seen wins. The parent sends SIGTERM to every running child and
// waits up to kill_grace for them (pidfd poll). It SIGKILLs the rest, reaps them all, stores the
// error and throws it. The error is remote_exception when the pipe carried text, else peer_lost
// with the exit code or the signal's name. Later joins rethrow the stored error.
// The destructor does the same terminate-and-reap for survivors, so no zombie and no orphan
// outlives the context. A child whose parent dies is SIGKILLed by the kernel (PR_SET_PDEATHSIG).
// Note that it fires when the *thread* that forked exits, so fork from a long-lived thread.
// The child starts with default signal handlers and an empty signal mask (see reset_signals).
// Without pidfd_open (kernel < 5.3) the wait falls back to polling waitpid every 20 ms.

#include "troupe/actors/spawn.hpp"

#include <cxxabi.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <typeinfo>

// A sanitizer build checks a child for leaks before its _exit (Note [leak check in children]).
#include "leak_check.hpp"

#include "troupe/actors/node_options.hpp"

namespace troupe {

namespace {

using steady = std::chrono::steady_clock;
constexpr std::size_t max_error_text = 16 * 1024;

std::string errno_text(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

void close_fd(int& fd) noexcept {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

int poll_ms_until(steady::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - steady::now()).count();
  return static_cast<int>(std::clamp<std::int64_t>(left, 0, 1 << 30));
}

// The demangled type of the exception being handled ("std::runtime_error").
std::string current_exception_type() {
  const std::type_info* ti = abi::__cxa_current_exception_type();
  if (ti == nullptr) return "unknown";
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(ti->name(), nullptr, nullptr, &status), std::free);
  return status == 0 && name ? std::string(name.get()) : std::string(ti->name());
}

void write_all(int fd, const std::string& text) noexcept {
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

// Gives the child the signal state of a fresh program. Handlers installed by the parent (a test
// framework's, a runtime's) would otherwise run on SIGTERM in the child. Ignored signals stay
// ignored (as across exec), and the signal mask is cleared so SIGTERM can end the child.
void reset_signals() noexcept {
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0) continue;
    const bool has_handler = (old.sa_flags & SA_SIGINFO) ? old.sa_sigaction != nullptr
                                                          : (old.sa_handler != SIG_DFL && old.sa_handler != SIG_IGN);
    if (has_handler) ::signal(sig, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

// Runs in the child after fork(): never returns, never runs the parent's static destructors.
// `token`: the job token the children share through TROUPE_JOB_TOKEN (Note [job token]).
[[noreturn]] void run_child(int rank, const std::function<void(int)>& fn, int err_fd, pid_t parent, const std::string& token) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // the parent died before prctl took effect
  reset_signals();
  ::setenv("TROUPE_JOB_TOKEN", token.c_str(), 1);
  int status = 0;
  try {
    fn(rank);
  } catch (const std::exception& e) {
    std::string text = current_exception_type() + ": " + e.what();
    if (text.size() > max_error_text) text.resize(max_error_text);
    write_all(err_fd, text);
    status = spawn_context::exception_exit_code;
  } catch (...) {
    write_all(err_fd, "exception of type " + current_exception_type() + " (not a std::exception)");
    status = spawn_context::exception_exit_code;
  }
  std::fflush(nullptr);
  ::_exit(detail::leak_checked(status));
}

}  // namespace

struct spawn_context::child {
  int rank = 0;
  pid_t pid = -1;
  int pidfd = -1;     // readable when the child exits; -1 without pidfd_open
  int err_pipe = -1;  // non-blocking read end of the error pipe
  bool reaped = false;
  int status = 0;     // waitpid status once reaped
  std::string text;   // what the child wrote into the error pipe

  void drain() {
    char buf[4096];
    while (err_pipe >= 0) {
      const ssize_t n = ::read(err_pipe, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      if (text.size() < max_error_text) text.append(buf, static_cast<std::size_t>(n));
    }
  }
  bool failed() const { return reaped && !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }
};

spawn_context::spawn_context() = default;
spawn_context::spawn_context(spawn_context&& o) noexcept
    : children_(std::move(o.children_)), opts_(o.opts_), failure_(std::move(o.failure_)) {
  o.children_.clear();
}
spawn_context& spawn_context::operator=(spawn_context&& o) noexcept {
  if (this != &o) {
    terminate_all();
    release();
    children_ = std::move(o.children_);
    o.children_.clear();
    opts_ = o.opts_;
    failure_ = std::move(o.failure_);
  }
  return *this;
}
spawn_context::~spawn_context() {
  terminate_all();
  release();
}

void spawn_context::release() noexcept {
  for (auto& c : children_) {
    close_fd(c.pidfd);
    close_fd(c.err_pipe);
  }
}

int spawn_context::nprocs() const noexcept { return static_cast<int>(children_.size()); }

int spawn_context::running() const noexcept {
  return static_cast<int>(std::count_if(children_.begin(), children_.end(), [](const child& c) { return !c.reaped; }));
}

std::vector<pid_t> spawn_context::pids() const {
  std::vector<pid_t> out;
  for (const auto& c : children_) out.push_back(c.pid);
  return out;
}

void spawn_context::kill(int rank, int sig) {
  if (rank < 0 || rank >= nprocs())
    throw error(errc::index_out_of_range,
                "spawn_context::kill: rank " + std::to_string(rank) + " of " + std::to_string(nprocs()));
  child& c = children_[static_cast<std::size_t>(rank)];
  if (c.reaped) return;
  if (::kill(c.pid, sig) != 0)
    throw error(errc::io_error, "spawn_context::kill(rank " + std::to_string(rank) + ", " + signal_name(sig) +
                                    "): " + errno_text("kill"));
}

// Reaps `c` if it has exited; true when it was reaped now.
bool spawn_context::reap(child& c) {
  if (c.reaped) return false;
  int status = 0;
  pid_t r = 0;
  do r = ::waitpid(c.pid, &status, WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  c.drain();
  c.reaped = true;
  c.status = r < 0 ? (127 << 8) : status;  // r < 0: someone else reaped it; count as lost
  close_fd(c.pidfd);
  close_fd(c.err_pipe);
  return true;
}

// One wait: reaps what has exited (throwing on a failure) or blocks in poll until the deadline.
std::optional<int> spawn_context::wait_step(steady::time_point deadline) {
  for (;;) {
    // One child per call: wait_any reports every exit, however close together they come.
    for (auto& c : children_) {
      c.drain();
      if (!reap(c)) continue;
      if (c.failed()) fail(c);
      return c.rank;
    }
    if (running() == 0 || steady::now() >= deadline) return std::nullopt;
    std::vector<pollfd> fds;
    bool have_pidfds = true;
    for (const auto& c : children_) {
      if (c.reaped) continue;
      if (c.pidfd >= 0) fds.push_back({c.pidfd, POLLIN, 0});
      else have_pidfds = false;
      if (c.err_pipe >= 0) fds.push_back({c.err_pipe, POLLIN, 0});
    }
    const int wait_ms = have_pidfds ? poll_ms_until(deadline) : std::min(poll_ms_until(deadline), 20);
    ::poll(fds.data(), fds.size(), wait_ms);
  }
}

bool spawn_context::join(std::chrono::milliseconds timeout) {
  if (failure_) throw *failure_;
  const auto deadline = steady::now() + timeout;
  while (running() > 0) {
    wait_step(deadline);
    if (running() > 0 && steady::now() >= deadline) return false;
  }
  return true;
}

std::optional<int> spawn_context::wait_any(std::chrono::milliseconds timeout) {
  if (failure_) throw *failure_;
  return wait_step(steady::now() + timeout);
}

void spawn_context::fail(const child& c) {
  std::string what = "spawn: rank " + std::to_string(c.rank) + " (pid " + std::to_string(c.pid) + ") ";
  errc code = errc::peer_lost;
  if (!c.text.empty()) {
    code = errc::remote_exception;
    what += "raised an exception: " + c.text;
  } else if (WIFSIGNALED(c.status)) {
    what += "was killed by signal " + signal_name(WTERMSIG(c.status)) + " (" + std::to_string(WTERMSIG(c.status)) + ")";
  } else {
    what += "exited with code " + std::to_string(WEXITSTATUS(c.status));
  }
  const int others = running();
  if (others > 0) what += "; terminated the " + std::to_string(others) + " other running children";
  terminate_all();
  failure_ = error(code, what);
  throw *failure_;
}

void spawn_context::terminate_all() noexcept {
  if (running() == 0) return;
  for (auto& c : children_)
    if (!c.reaped) ::kill(c.pid, SIGTERM);
  const auto deadline = steady::now() + opts_.kill_grace;
  for (;;) {
    std::vector<pollfd> fds;
    for (auto& c : children_) {
      c.drain();
      reap(c);
      if (!c.reaped && c.pidfd >= 0) fds.push_back({c.pidfd, POLLIN, 0});
    }
    if (running() == 0 || steady::now() >= deadline) break;
    const int wait_ms = fds.size() == static_cast<std::size_t>(running()) ? poll_ms_until(deadline)
                                                                         : std::min(poll_ms_until(deadline), 20);
    ::poll(fds.data(), fds.size(), wait_ms);
  }
  for (auto& c : children_) {
    if (c.reaped) continue;
    ::kill(c.pid, SIGKILL);
    int status = 0;
    while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
    }
    c.drain();
    c.reaped = true;
    c.status = status;
    close_fd(c.pidfd);
    close_fd(c.err_pipe);
  }
}

spawn_context spawn_children(int nprocs, const std::function<void(int)>& fn, const spawn_options& opts) {
  if (nprocs < 1) throw error(errc::bad_argument, "spawn: nprocs must be >= 1, got " + std::to_string(nprocs));
  if (!fn) throw error(errc::bad_argument, "spawn: empty function");
  spawn_context ctx;
  ctx.opts_ = opts;
  ctx.children_.reserve(static_cast<std::size_t>(nprocs));
  const pid_t parent = ::getpid();
  // The children share the caller's job token, or a fresh random one (node_options::from_env
  // reads it), so their nodes never run with an empty token.
  const char* given = std::getenv("TROUPE_JOB_TOKEN");
  const std::string token = given && *given ? given : node_options::random_token();
  std::fflush(nullptr);  // buffered output would otherwise be written once per child too
  // Signals stay blocked across fork() until the child has reset the parent's handlers, so an
  // early kill() never runs a parent handler in the child.
  sigset_t all, old;
  sigfillset(&all);
  for (int rank = 0; rank < nprocs; ++rank) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw error(errc::io_error, "spawn: " + errno_text("pipe2"));
    ::pthread_sigmask(SIG_SETMASK, &all, &old);
    const pid_t pid = ::fork();
    if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (pid < 0) {
      const std::string text = errno_text("fork");
      ::close(p[0]);
      ::close(p[1]);
      throw error(errc::io_error, "spawn: rank " + std::to_string(rank) + ": " + text);
    }
    if (pid == 0) {
      ::close(p[0]);
      run_child(rank, fn, p[1], parent, token);
    }
    ::close(p[1]);
    ::fcntl(p[0], F_SETFL, ::fcntl(p[0], F_GETFL) | O_NONBLOCK);
    spawn_context::child c;
    c.rank = rank;
    c.pid = pid;
    c.err_pipe = p[0];
    c.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (c.pidfd >= 0) ::fcntl(c.pidfd, F_SETFD, FD_CLOEXEC);
    ctx.children_.push_back(std::move(c));
  }
  return ctx;
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  if (abbrev != nullptr) return std::string("SIG") + abbrev;
  return "signal " + std::to_string(sig);
}

}  // namespace troupe
