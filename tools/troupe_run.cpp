// troupe-run: starts the ranks of a job on this host, like torchrun, and joins the launchers of
// the other hosts of a multi-node job.
//
//   troupe-run --nproc-per-node 2 [--nnodes 1 --node-rank 0] [--master-addr 127.0.0.1]
//              [--master-port 0] [--job-token T] [--listen-addr A] [--max-restarts 0]
//              [--restart job|rank] [--timeout-s 0] [--] prog args...
// (torchrun's spellings are accepted too: Note [launcher options] in launcher/launch_options.hpp.)
//
// Note [launcher]
// Each local rank is a child process (troupe::spawn) that execs `prog` with the launcher
// conventions in its environment:
//   - RANK = node_rank * nproc + local rank, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE;
//   - MASTER_ADDR, MASTER_PORT;
//   - TROUPE_JOB_TOKEN: random for a single-node job when not given, so two jobs on one host
//     never join each other; required for several nodes;
//   - TROUPE_LISTEN_ADDR, TROUPE_RESTART_COUNT;
//   - TROUPE_REPLACEMENT: 1 in a rank restarted alone (Note [rank restart]).
// Rank 0 hosts the store. A master port of 0 picks a free one (one node only).
//
//   launcher --spawn--> rank i: exec prog (env) ... exit
//   any rank fails (exit != 0 / signal) --> the others get SIGTERM, then SIGKILL (spawn)
//   --> restarts left? start every rank again (new port, TROUPE_RESTART_COUNT + 1; the program
//       resumes from its checkpoint, ddp::checkpointer) : print the failure (rank, pid, cause), exit 1
//
// Several nodes: the launchers meet on the master's --master-port (Note [launcher channel] in
// launcher/channel.hpp). Rank 0's store gets a port of its own, which the master's launcher
// picks and hands out. A failure on any node stops the ranks of every node. With
// --max-restarts R the job restarts on every node, at most R times in all; the master's R
// counts (Note [job restart] in launcher/channel.hpp). Then every launcher prints
// "troupe-run: job failed: rank R ... on host H ..." and exits 1.
//
// --restart rank restarts only the rank that died (Note [rank restart] below).
//
// Exit codes (torchrun's): 0 success, 1 a rank or node failed, 2 bad usage. Besides: SIGINT/SIGTERM
// to the launcher stop every rank and exit 130/143; a timeout (--timeout-s) stops every rank and
// exits 124. Children die with the launcher (PR_SET_PDEATHSIG in spawn).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "launcher/channel.hpp"
#include "launcher/launch_options.hpp"
#include "troupe/actors/host_address.hpp"
#include "troupe/actors/spawn.hpp"

using troupe::launcher::channel;
using troupe::launcher::launch_options;

namespace {

std::atomic<int> g_stop_signal{0};  // written by the signal handler only

// A free TCP port on `addr` (bound then released; rank 0 binds it again right away).
int free_port(const std::string& addr) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (!troupe::is_wildcard_address(addr)) ::inet_pton(AF_INET, addr.c_str(), &a.sin_addr);
  else a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw troupe::error(troupe::errc::io_error, "troupe-run: cannot find a free port on " + addr);
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

std::string random_token() {
  std::random_device rd;
  std::string t;
  for (int i = 0; i < 4; ++i) {
    char buf[9];
    std::snprintf(buf, sizeof(buf), "%08x", rd());
    t += buf;
  }
  return t;
}

std::string host_name() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

[[noreturn]] void exec_rank(const launch_options& o, int local, int port, int restart, bool replacement = false) {
  const int world = o.nproc * o.nnodes;
  ::setenv("RANK", std::to_string(o.node_rank * o.nproc + local).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
  ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("TROUPE_JOB_TOKEN", o.token.c_str(), 1);
  ::setenv("TROUPE_LISTEN_ADDR", o.listen_addr.c_str(), 1);
  if (!o.tls_cert.empty()) ::setenv("TROUPE_TLS_CERT", o.tls_cert.c_str(), 1);
  if (!o.tls_key.empty()) ::setenv("TROUPE_TLS_KEY", o.tls_key.c_str(), 1);
  if (!o.tls_ca.empty()) ::setenv("TROUPE_TLS_CA", o.tls_ca.c_str(), 1);
  ::setenv("TROUPE_RESTART_COUNT", std::to_string(restart).c_str(), 1);
  ::setenv("TROUPE_REPLACEMENT", replacement ? "1" : "0", 1);
  std::vector<char*> args;
  for (const auto& s : o.command) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  throw troupe::error(troupe::errc::io_error, "cannot execute '" + o.command[0] + "': " + std::strerror(errno));
}

// spawn names local ranks ("spawn: rank 1 (pid 42) exited ..."); the job names global ranks and
// the host ("rank 3 (local rank 1, pid 42) on host h1 exited ...").
std::string describe_failure(const launch_options& o, const std::string& spawn_text) {
  const std::string prefix = "spawn: rank ";
  if (spawn_text.rfind(prefix, 0) != 0) return spawn_text + " on host " + host_name();
  std::size_t used = 0;
  const int local = std::stoi(spawn_text.substr(prefix.size()), &used);
  std::string rest = spawn_text.substr(prefix.size() + used);  // " (pid 42) exited ..."
  const auto close = rest.find(')');
  const std::string pid = rest.substr(2, close - 2);
  rest = rest.substr(close + 1);
  return "rank " + std::to_string(o.node_rank * o.nproc + local) + " (local rank " + std::to_string(local) + ", " + pid +
         ") on host " + host_name() + rest;
}

// Why the launcher stops without a failure of the job: a signal or the timeout (0: no reason).
int stop_reason(const launch_options& o, std::chrono::steady_clock::time_point start) {
  if (const int sig = g_stop_signal.load()) {
    std::fprintf(stderr, "troupe-run: got signal %d, stopping every rank\n", sig);
    return 128 + sig;
  }
  if (o.timeout_s > 0 && std::chrono::steady_clock::now() - start > std::chrono::seconds(o.timeout_s)) {
    std::fprintf(stderr, "troupe-run: timed out after %d s, stopping every rank\n", o.timeout_s);
    return 124;
  }
  return 0;
}

int job_failed(const std::string& what) {
  std::fprintf(stderr, "troupe-run: job failed: %s\n", what.c_str());
  return 1;
}

// Runs one attempt on one node. Returns 0 on success, the launcher's exit code otherwise;
// `failed` says whether a rank failed (worth a restart) rather than a stop signal or the timeout.
int attempt(const launch_options& o, int port, int restart, bool& failed) {
  failed = false;
  auto ctx = troupe::spawn(o.nproc, [&](int local) { exec_rank(o, local, port, restart); });
  const auto start = std::chrono::steady_clock::now();
  try {
    while (!ctx.join(std::chrono::milliseconds(100)))
      if (const int code = stop_reason(o, start)) return code;  // ctx's destructor stops and reaps the ranks
  } catch (const troupe::error& e) {
    failed = true;
    std::fprintf(stderr, "troupe-run: %s\n", e.what());
    return 1;
  }
  return 0;
}

// Note [rank restart]
// With --restart rank (one host) each rank is a spawn of its own. When a rank other than 0
// fails and restarts are left, it alone starts again, with TROUPE_REPLACEMENT=1 and
// TROUPE_RESTART_COUNT = the restarts used so far. The survivors keep running and heal their
// process group (ddp::live_group, Note [live recovery]). Rank 0 hosts the store: its failure
// stops every rank, and the job restarts (one restart of the budget too). A rank that exits 0
// is done; the job succeeds when every rank is.
//
//   rank r != 0 fails --> restarts left? spawn rank r alone (TROUPE_REPLACEMENT=1) : stop all, exit 1
//   rank 0 fails      --> stop every rank --> restarts left? start every rank again : exit 1

// Runs the ranks of one attempt under Note [rank restart]; `restarts` counts restarts of the
// job and of single ranks. `failed` as in attempt().
int attempt_by_rank(const launch_options& o, int port, int& restarts, bool& failed) {
  failed = false;
  std::vector<std::optional<troupe::spawn_context>> ranks(static_cast<std::size_t>(o.nproc));
  auto start_rank = [&](int local, bool replacement) {
    ranks[local].reset();
    ranks[local].emplace(troupe::spawn(1, [&](int) { exec_rank(o, local, port, restarts, replacement); }));
  };
  for (int i = 0; i < o.nproc; ++i) start_rank(i, false);
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    bool running = false;
    for (int i = 0; i < o.nproc; ++i) {
      if (!ranks[i]) continue;
      try {
        if (ranks[i]->join(std::chrono::milliseconds(20))) ranks[i].reset();
        else running = true;
      } catch (const troupe::error& e) {
        std::string text = e.message();  // the spawn names its only child "rank 0"
        if (text.rfind("spawn: rank 0", 0) == 0) text = "spawn: rank " + std::to_string(i) + text.substr(13);
        const std::string what = describe_failure(o, text);
        if (o.node_rank * o.nproc + i == 0 || restarts >= o.max_restarts) {
          std::fprintf(stderr, "troupe-run: %s\n", what.c_str());
          failed = true;
          return 1;  // the destructors stop and reap the other ranks
        }
        ++restarts;
        std::fprintf(stderr, "troupe-run: %s; restarting that rank alone (%d of %d)\n", what.c_str(), restarts, o.max_restarts);
        start_rank(i, true);
        running = true;
      }
    }
    if (!running) return 0;
    if (const int code = stop_reason(o, start)) return code;
  }
}

// The loop of --restart rank: a failure that attempt_by_rank cannot heal restarts the job.
int run_by_rank(const launch_options& o) {
  for (int restarts = 0;;) {
    bool failed = false;
    const int port = o.master_port != 0 ? o.master_port : free_port(o.listen_addr);
    const int code = attempt_by_rank(o, port, restarts, failed);
    if (code == 0 || !failed) return code;
    if (restarts >= o.max_restarts)
      return o.max_restarts > 0 ? job_failed("the failure above (no restarts left: " + std::to_string(o.max_restarts) + " used)") : code;
    ++restarts;
    std::fprintf(stderr, "troupe-run: restarting every rank (%d of %d)\n", restarts, o.max_restarts);
  }
}

// Master: after a failure of the current attempt, restarts the job while the budget lasts
// (Note [job restart]); sets `next_port` when it does.
int master_decides(const launch_options& o, channel& ch, const std::string& what, int& next_port) {
  if (ch.attempt() < o.max_restarts) {
    next_port = free_port(o.listen_addr);
    std::fprintf(stderr, "troupe-run: %s; restarting every rank of the job (%d of %d)\n", what.c_str(), ch.attempt() + 1,
                 o.max_restarts);
    ch.restart(next_port);
    return 0;
  }
  const std::string text = o.max_restarts > 0 ? what + " (no restarts left: " + std::to_string(o.max_restarts) + " used)" : what;
  ch.report_failure(text);
  return job_failed(text);
}

// Acts on news from the other launchers: -1 when there is none (or it changes nothing).
int on_event(const launch_options& o, channel& ch, const std::optional<channel::event>& e, int& next_port) {
  if (!e) return -1;
  switch (e->what) {
    case channel::event::kind::failed: return master_decides(o, ch, e->text, next_port);
    case channel::event::kind::stop: return job_failed(e->text);
    case channel::event::kind::restart:
      ch.adopt(*e);
      next_port = e->store_port;
      std::fprintf(stderr, "troupe-run: the master restarts every rank of the job (attempt %d)\n", e->attempt);
      return 0;
  }
  return -1;
}

// Node: after a failure here, waits (bounded) for the master's verdict: restart or stop.
int await_verdict(const launch_options& o, channel& ch, const std::string& what, int& next_port) {
  ch.report_failure(what);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline)
    if (const int code = on_event(o, ch, ch.next_event(std::chrono::milliseconds(100)), next_port); code >= 0) return code;
  return job_failed(what + " (no answer from the master launcher)");
}

// Runs one attempt of a multi-node job (Note [launcher channel]). Returns the exit code, or 0
// with `next_port` set when the job restarts.
int attempt_on_node(const launch_options& o, int port, channel& ch, int& next_port) {
  next_port = 0;
  auto ctx = troupe::spawn(o.nproc, [&](int local) { exec_rank(o, local, port, ch.attempt()); });
  const auto start = std::chrono::steady_clock::now();
  const auto tick = std::chrono::milliseconds(20);
  try {
    while (!ctx.join(tick)) {
      if (const int code = stop_reason(o, start)) return code;  // ctx's destructor stops and reaps the ranks
      if (const int code = on_event(o, ch, ch.next_event(tick), next_port); code >= 0) return code;
    }
  } catch (const troupe::error& e) {
    const std::string what = describe_failure(o, e.message());
    return o.node_rank == 0 ? master_decides(o, ch, what, next_port) : await_verdict(o, ch, what, next_port);
  }
  ch.mark_done();
  while (!ch.ended()) {  // the other nodes still run
    if (const int code = stop_reason(o, start)) return code;
    if (const int code = on_event(o, ch, ch.next_event(tick), next_port); code >= 0) return code;
  }
  return 0;
}

// The launchers of a multi-node job meet (Note [launcher channel]); returns the store's port.
std::optional<channel> rendezvous(const launch_options& o, int& port) {
  try {
    if (o.node_rank == 0) {
      auto ch = channel::serve(o, o.listen_addr, host_name());
      port = free_port(o.listen_addr);
      ch.start(port);
      return ch;
    }
    auto ch = channel::join(o, host_name());
    port = ch.store_port();
    return ch;
  } catch (const troupe::error& e) {
    std::fprintf(stderr, "troupe-run: node %d on host %s: %s\n", o.node_rank, host_name().c_str(), e.message().c_str());
    return std::nullopt;
  }
}

// Fills the job token and the listen address (Note [listen and advertise]).
void complete(launch_options& o) {
  if (o.token.empty()) o.token = random_token();
  if (!o.listen_addr.empty()) return;
  try {
    o.listen_addr = troupe::is_loopback_address(o.master_addr) ? "127.0.0.1" : troupe::routable_address(o.master_addr);
  } catch (const troupe::error& e) {
    std::fprintf(stderr, "troupe-run: cannot find this host's address toward the master %s: %s\n", o.master_addr.c_str(),
                 e.message().c_str());
    std::exit(2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  auto o = troupe::launcher::parse_options(argc, argv);
  complete(o);
  struct sigaction sa{};
  sa.sa_handler = [](int sig) { g_stop_signal.store(sig); };
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  if (o.multi_node()) {
    int port = 0;
    auto ch = rendezvous(o, port);
    if (!ch) return 1;
    for (;;) {
      int next_port = 0;
      const int code = attempt_on_node(o, port, *ch, next_port);
      if (code != 0 || next_port == 0) return code;
      port = next_port;
    }
  }
  if (o.restart_rank) return run_by_rank(o);
  for (int restart = 0;; ++restart) {
    bool failed = false;
    const int port = o.master_port != 0 ? o.master_port : free_port(o.listen_addr);
    const int code = attempt(o, port, restart, failed);
    if (code == 0 || !failed) return code;
    if (restart >= o.max_restarts)
      return o.max_restarts > 0 ? job_failed("the failure above (no restarts left: " + std::to_string(o.max_restarts) + " used)") : code;
    std::fprintf(stderr, "troupe-run: restarting every rank (%d of %d)\n", restart + 1, o.max_restarts);
  }
}
