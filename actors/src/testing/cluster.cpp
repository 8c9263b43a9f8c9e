// The cluster test fixture (Note [cluster fixture] in troupe/actors/testing/cluster.hpp).
#include "troupe/actors/testing/cluster.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "leak_check.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::testing {

namespace {

using clock_type = std::chrono::steady_clock;

std::set<std::string> shm_segments() {
  std::set<std::string> out;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (const dirent* e = ::readdir(d))
      if (std::string(e->d_name).rfind("troupe", 0) == 0) out.insert(e->d_name);
    ::closedir(d);
  }
  return out;
}

// Whether a process of group `pgid` still runs. A zombie does not count: it ran to its end and
// waits only for its parent (init, for an orphan) to reap it.
bool group_runs(pid_t pgid) {
  DIR* d = ::opendir("/proc");
  if (!d) return ::kill(-pgid, 0) == 0;
  bool runs = false;
  while (const dirent* e = ::readdir(d)) {
    if (!std::isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
    const std::string path = std::string("/proc/") + e->d_name + "/stat";
    FILE* f = std::fopen(path.c_str(), "r");
    if (!f) continue;  // it ended while we looked
    char line[512];
    const bool got = std::fgets(line, sizeof line, f) != nullptr;
    std::fclose(f);
    // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so read after the last ')'.
    const char* close = got ? std::strrchr(line, ')') : nullptr;
    char state = 0;
    int ppid = 0, pgrp = 0;
    if (close && std::sscanf(close + 1, " %c %d %d", &state, &ppid, &pgrp) == 3 && pgrp == pgid && state != 'Z') {
      runs = true;
      break;
    }
  }
  ::closedir(d);
  return runs;
}

std::uint16_t read_port(int fd, std::chrono::milliseconds timeout) {
  pollfd p{fd, POLLIN, 0};
  std::uint16_t port = 0;
  if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1 || ::read(fd, &port, sizeof(port)) != sizeof(port))
    throw error(errc::timeout, "no port from rank 0");
  return port;
}

// Moves this freshly forked rank onto its namespace host (Note [cluster fixture]). It enters the
// host's network namespace, and a UTS namespace of its own with the host's name.
void enter_host(const cluster_host& h) {
  const std::string path = "/run/netns/" + h.netns;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw error(errc::io_error, "run_cluster: cannot open the network namespace " + path + ": " + std::strerror(errno));
  const int rc = ::setns(fd, CLONE_NEWNET);
  const int saved = errno;
  ::close(fd);
  if (rc != 0) throw error(errc::io_error, "run_cluster: cannot enter the network namespace " + h.netns + ": " + std::strerror(saved));
  if (::unshare(CLONE_NEWUTS) != 0 || ::sethostname(h.netns.c_str(), h.netns.size()) != 0)
    throw error(errc::io_error, "run_cluster: cannot name the host " + h.netns + ": " + std::strerror(errno));
}

const cluster_host& host_of(const cluster_options& o, int rank) {
  return o.hosts[static_cast<std::size_t>(rank) * o.hosts.size() / static_cast<std::size_t>(o.world)];
}

// The body of one forked rank; never returns.
[[noreturn]] void run_rank(const cluster_options& o, int rank, int fds[2], const std::function<int(node&)>& job) {
  int code = 2;
  try {
    if (!o.plan_file.empty()) ::setenv("TROUPE_FAULTS", o.plan_file.c_str(), 1);
    node_options no;
    if (!o.hosts.empty()) {
      enter_host(host_of(o, rank));
      no.listen_addr = host_of(o, rank).address;
      no.master_addr = host_of(o, 0).address;
    }
    no.rank = rank;
    no.world_size = o.world;
    no.job_token = o.job_token;
    no.default_timeout = o.call_timeout;
    no.connection_timeout = o.peer_timeout;
    no.join_timeout = std::chrono::seconds(10);
    if (rank != 0) no.master_port = read_port(fds[0], o.bound);
    node n(no);
    if (rank == 0)
      for (int i = 1; i < o.world; ++i) {
        const std::uint16_t port = n.port();
        if (::write(fds[1], &port, sizeof(port)) != sizeof(port)) throw error(errc::io_error, "port pipe write failed");
      }
    code = job(n);
    n.shutdown(shutdown_mode::immediate);
  } catch (const error& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
  }
  std::fflush(nullptr);
  ::_exit(detail::leak_checked(code));  // Note [leak check in children]
}

// Whether a segment name carries one of the ranks' pids (a `_PID_`, `_PID` or `-PID` token).
// So segments of other processes on the machine are not counted.
bool ours(const std::string& name, const std::vector<pid_t>& pids) {
  for (pid_t p : pids) {
    if (p <= 0) continue;
    const std::string id = std::to_string(p);
    for (const char* sep : {"_", "-"}) {
      const std::string tok = sep + id;
      for (auto at = name.find(tok); at != std::string::npos; at = name.find(tok, at + 1)) {
        const std::size_t end = at + tok.size();
        if (end == name.size() || !std::isdigit(static_cast<unsigned char>(name[end]))) return true;
      }
    }
  }
  return false;
}

// Waits for every pid up to `end`; fills outcomes. Returns whether some rank was still running.
bool reap(std::vector<pid_t>& pids, std::vector<rank_outcome>& out, clock_type::time_point end) {
  std::size_t left = 0;
  for (pid_t p : pids) left += p > 0;
  while (left > 0 && clock_type::now() < end) {
    for (std::size_t r = 0; r < pids.size(); ++r) {
      if (pids[r] <= 0) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) != pids[r]) continue;
      out[r].exited = WIFEXITED(status);
      out[r].exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      out[r].signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      pids[r] = 0;
      --left;
    }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polls child exits; no ordering relies on it
  }
  return left > 0;
}

}  // namespace

bool cluster_result::all_succeeded() const {
  for (const auto& r : ranks)
    if (!r.exited || r.exit_code != 0) return false;
  return !timed_out;
}

std::string cluster_result::describe() const {
  std::string out = timed_out ? "timed out\n" : "";
  for (const auto& r : ranks)
    out += "rank " + std::to_string(r.rank) + (r.exited ? ": exit " + std::to_string(r.exit_code) : ": signal " + std::to_string(r.signal)) + "\n";
  for (const auto& l : leaks) out += "leak: " + l + "\n";
  return out;
}

cluster_result run_cluster(const cluster_options& o, const std::function<int(node&)>& job) {
  if (o.world < 1) throw error(errc::bad_argument, "run_cluster: world must be at least 1, got " + std::to_string(o.world));
  for (const auto& h : o.hosts)
    if (h.netns.empty() || h.address.empty())
      throw error(errc::bad_argument, "run_cluster: a host needs a network namespace and an address, got '" + h.netns + "' at '" + h.address + "'");
  const auto shm_before = shm_segments();
  int fds[2];
  if (::pipe(fds) != 0) throw error(errc::io_error, "run_cluster: pipe() failed");
  cluster_result res;
  std::vector<pid_t> pids(static_cast<std::size_t>(o.world), 0);
  const auto begin = clock_type::now();
  std::fflush(nullptr);
  for (int r = 0; r < o.world; ++r) {
    res.ranks.push_back(rank_outcome{r, false, -1, 0});
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      run_rank(o, r, fds, job);
    }
    if (pid < 0) {
      std::fprintf(stderr, "run_cluster: cannot fork rank %d\n", r);
      break;  // the rank stays "never ended" in the result
    }
    ::setpgid(pid, pid);  // either side may win; both set the same group
    pids[static_cast<std::size_t>(r)] = pid;
  }
  const std::vector<pid_t> groups = pids;
  res.timed_out = reap(pids, res.ranks, begin + o.bound);
  if (res.timed_out) {
    for (pid_t g : groups)
      if (g > 0) ::kill(-g, SIGKILL);
    reap(pids, res.ranks, clock_type::now() + std::chrono::seconds(10));
  }
  res.took = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - begin);
  ::close(fds[0]);
  ::close(fds[1]);
  // A rank's helper that saw its rank end gets a short grace to end too. For example,
  // clang's sanitizers symbolize a leak report through an llvm-symbolizer child, which ends at
  // its rank's exit, a few milliseconds later.
  const auto grace = clock_type::now() + std::chrono::seconds(2);
  for (pid_t g : groups) {
    if (g <= 0) continue;
    while (group_runs(g) && clock_type::now() < grace) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (group_runs(g)) {
      res.leaks.push_back("process group " + std::to_string(g) + " still has processes");
      ::kill(-g, SIGKILL);
    }
  }
  for (const auto& s : shm_segments())
    if (!shm_before.count(s) && ours(s, groups)) res.leaks.push_back("/dev/shm/" + s);
  return res;
}

}  // namespace troupe::testing
