// troupe-run: starts the ranks of a job on this host, like torchrun.
//
//   troupe-run --nproc-per-node 2 [--nnodes 1 --node-rank 0] [--master-addr 127.0.0.1]
//              [--master-port 0] [--job-token T] [--max-restarts 0] [--timeout-s 0] -- prog args...
//
// Note [launcher]
// Each local rank is a child process (troupe::spawn) that execs `prog` with the launcher
// conventions in its environment: RANK = node_rank * nproc + local rank, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TROUPE_JOB_TOKEN (random when not given, so two
// jobs on one host never join each other) and TROUPE_RESTART_COUNT. Rank 0 hosts the store. A
// master port of 0 picks a free one (one node only; several nodes must agree on a port).
//
//   launcher --spawn--> rank i: exec prog (env) ... exit
//   any rank fails (exit != 0 / signal) --> the others get SIGTERM, then SIGKILL (spawn)
//   --> restarts left? start every rank again (new port, TROUPE_RESTART_COUNT + 1; the program
//       resumes from its own checkpoint) : print the failure (rank, pid, code/signal), exit 1
//
// SIGINT/SIGTERM to the launcher stop every rank and exit 130/143. A timeout (--timeout-s) stops
// every rank and exits 124. Children die with the launcher (PR_SET_PDEATHSIG in spawn).
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "troupe/actors/spawn.hpp"

namespace {

std::atomic<int> g_stop_signal{0};  // written by the signal handler only

void on_signal(int sig) { g_stop_signal.store(sig); }

struct launch_options {
  int nproc = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::string token;
  int max_restarts = 0;
  int timeout_s = 0;
  std::vector<std::string> command;
};

constexpr const char* usage_text =
    "usage: troupe-run --nproc-per-node N [--nnodes M --node-rank K] [--master-addr A]\n"
    "                  [--master-port P] [--job-token T] [--max-restarts R] [--timeout-s S] -- prog args...\n"
    "Starts N ranks of prog on this host, like torchrun; each gets RANK, WORLD_SIZE, LOCAL_RANK,\n"
    "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TROUPE_JOB_TOKEN and TROUPE_RESTART_COUNT.\n"
    "  --nproc-per-node N   ranks on this host (default 1)\n"
    "  --nnodes M           hosts in the job (default 1)\n"
    "  --node-rank K        this host's index, 0 to M-1 (default 0)\n"
    "  --master-addr A      address of rank 0, the store host (default 127.0.0.1)\n"
    "  --master-port P      port of rank 0; 0 picks a free one, one host only (default 0)\n"
    "  --job-token T        shared secret of the job (default: TROUPE_JOB_TOKEN, else random)\n"
    "  --max-restarts R     start every rank again after a failure, up to R times (default 0)\n"
    "  --timeout-s S        stop every rank after S seconds and exit 124; 0 means none (default 0)\n"
    "  --help               this text\n"
    "The first rank that fails stops the others and is named; the launcher then exits 1.\n";

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "troupe-run: %s\n%s", why.c_str(), usage_text);
  std::exit(2);
}

const std::vector<std::string> known_flags = {"--nproc-per-node", "--nnodes",   "--node-rank",    "--master-addr",
                                              "--master-port",    "--job-token", "--max-restarts", "--timeout-s"};

int parse_int(const std::string& flag, const std::string& text, int min) {
  std::size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || v < min) usage(flag + " needs an integer >= " + std::to_string(min) + ", got '" + text + "'");
  return v;
}

launch_options parse(int argc, char** argv) {
  launch_options o;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") break;
    if (a == "--help" || a == "-h") {
      std::fputs(usage_text, stdout);
      std::exit(0);
    }
    if (std::find(known_flags.begin(), known_flags.end(), a) == known_flags.end())
      usage("unknown option " + a);
    if (i + 1 >= argc) usage("missing value after " + a);
    const std::string v = argv[++i];
    if (a == "--nproc-per-node") o.nproc = parse_int(a, v, 1);
    else if (a == "--nnodes") o.nnodes = parse_int(a, v, 1);
    else if (a == "--node-rank") o.node_rank = parse_int(a, v, 0);
    else if (a == "--master-addr") o.master_addr = v;
    else if (a == "--master-port") o.master_port = parse_int(a, v, 0);
    else if (a == "--job-token") o.token = v;
    else if (a == "--max-restarts") o.max_restarts = parse_int(a, v, 0);
    else if (a == "--timeout-s") o.timeout_s = parse_int(a, v, 0);
    else usage("unknown option " + a);
  }
  for (++i; i < argc; ++i) o.command.emplace_back(argv[i]);
  if (o.command.empty()) usage("no program given after --");
  if (o.node_rank >= o.nnodes) usage("--node-rank must be below --nnodes");
  if (o.nnodes > 1 && o.master_port == 0) usage("--master-port must be given when --nnodes > 1");
  return o;
}

// A free TCP port on loopback (bound then released; rank 0 binds it again right away).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw troupe::error(troupe::errc::io_error, "troupe-run: cannot find a free port");
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

[[noreturn]] void exec_rank(const launch_options& o, int local, int port, int restart) {
  const int world = o.nproc * o.nnodes;
  ::setenv("RANK", std::to_string(o.node_rank * o.nproc + local).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(o.nproc).c_str(), 1);
  ::setenv("MASTER_ADDR", o.master_addr.c_str(), 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("TROUPE_JOB_TOKEN", o.token.c_str(), 1);
  ::setenv("TROUPE_RESTART_COUNT", std::to_string(restart).c_str(), 1);
  std::vector<char*> args;
  for (const auto& s : o.command) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  throw troupe::error(troupe::errc::io_error, "cannot execute '" + o.command[0] + "': " + std::strerror(errno));
}

// Runs one attempt. Returns 0 on success, the launcher's exit code otherwise; `failed` says
// whether a rank failed (worth a restart) rather than a stop signal or the timeout.
int attempt(const launch_options& o, int restart, bool& failed) {
  failed = false;
  const int port = o.master_port != 0 ? o.master_port : free_port();
  auto ctx = troupe::spawn(o.nproc, [&](int local) { exec_rank(o, local, port, restart); });
  const auto start = std::chrono::steady_clock::now();
  try {
    while (!ctx.join(std::chrono::milliseconds(100))) {
      if (const int sig = g_stop_signal.load()) {
        std::fprintf(stderr, "troupe-run: got signal %d, stopping every rank\n", sig);
        return 128 + sig;  // ctx's destructor stops and reaps the ranks
      }
      if (o.timeout_s > 0 && std::chrono::steady_clock::now() - start > std::chrono::seconds(o.timeout_s)) {
        std::fprintf(stderr, "troupe-run: timed out after %d s, stopping every rank\n", o.timeout_s);
        return 124;
      }
    }
  } catch (const troupe::error& e) {
    std::fprintf(stderr, "troupe-run: %s\n", e.what());
    failed = true;
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto o = parse(argc, argv);
  if (o.token.empty()) {
    const char* env = std::getenv("TROUPE_JOB_TOKEN");
    o.token = env && *env ? env : random_token();
  }
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  for (int restart = 0;; ++restart) {
    bool failed = false;
    const int code = attempt(o, restart, failed);
    if (code == 0 || !failed || restart >= o.max_restarts) return code;
    std::fprintf(stderr, "troupe-run: restarting every rank (%d of %d)\n", restart + 1, o.max_restarts);
  }
}
