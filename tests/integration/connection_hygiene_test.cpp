// Connections that never authenticate (Note [connection hygiene] in rpc/accept_guard.hpp) and
// bytes aimed at CAF (Note [CAF port gate] in caf_gate.hpp): bounded in time, number and memory.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <thread>
#include <memory>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

namespace {

// Two nodes in this process (real loopback TCP between them); worker1 serves "add".
struct node_pair {
  std::unique_ptr<troupe::node> n0, n1;
  explicit node_pair(std::chrono::milliseconds deadline, std::size_t cap) {
    auto o0 = troupe::test::test_options(0, 2, 0, "hygiene");
    o0.auth_deadline = deadline;
    o0.max_unauthenticated = cap;
    n0 = std::make_unique<troupe::node>(o0);
    auto o1 = troupe::test::test_options(1, 2, n0->port(), "hygiene");
    o1.auth_deadline = deadline;
    o1.max_unauthenticated = cap;
    n1 = std::make_unique<troupe::node>(o1);
    n1->functions().add("add", [](int a, int b) { return a + b; });
  }
  ~node_pair() {
    n1->shutdown(troupe::shutdown_mode::immediate);
    n0->shutdown(troupe::shutdown_mode::immediate);
  }
};

// A socket connected to 127.0.0.1:port that says nothing (RAII).
struct idle_conn {
  int fd = -1;
  explicit idle_conn(std::uint16_t port) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
      throw troupe::error(troupe::errc::io_error, "cannot connect to port " + std::to_string(port));
  }
  ~idle_conn() { ::close(fd); }
  idle_conn(const idle_conn&) = delete;
  idle_conn& operator=(const idle_conn&) = delete;
  // Whether the node closed it (EOF or reset), without waiting.
  bool closed() const {
    pollfd p{fd, POLLIN, 0};
    char c = 0;
    return ::poll(&p, 1, 0) == 1 && ::recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
  }
};

using idle_set = std::vector<std::unique_ptr<idle_conn>>;

idle_set open_idle(std::uint16_t port, int n) {
  idle_set s;
  for (int i = 0; i < n; ++i) s.push_back(std::make_unique<idle_conn>(port));
  return s;
}

std::size_t count_closed(const idle_set& s) {
  std::size_t n = 0;
  for (const auto& c : s) n += c->closed() ? 1 : 0;
  return n;
}

// Waits (bounded by `within`) until at least `want` of `s` are closed; returns how many are.
std::size_t closed_within(const idle_set& s, std::size_t want, std::chrono::milliseconds within) {
  const auto end = steady::now() + within;
  std::size_t n = count_closed(s);
  while (n < want && steady::now() < end) {
    std::this_thread::sleep_for(20ms);  // polling a condition, not synchronising
    n = count_closed(s);
  }
  return n;
}

long rss_kib() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

}  // namespace

TEST_CASE("idle unauthenticated connections are closed by the deadline and the node keeps serving", "[actors][security]") {
  node_pair p(1000ms, 512);
  CHECK(troupe::rpc_sync<int>(*p.n0, "worker1", "add", 1, 2, 5s) == 3);
  const auto opened = steady::now();
  auto direct = open_idle(p.n1->rpc_port(), 200);
  auto caf = open_idle(p.n1->port(), 100);
  CHECK(troupe::rpc_sync<int>(*p.n0, "worker1", "add", 2, 3, 5s) == 5);  // served meanwhile
  CHECK(closed_within(direct, 200, 6s) == 200);
  CHECK(closed_within(caf, 100, 1s) == 100);
  CHECK(steady::now() - opened < 6s);
  CHECK(troupe::rpc_sync<int>(*p.n0, "worker1", "add", 4, 5, 5s) == 9);
}

TEST_CASE("connections waiting to authenticate are capped per listener and a real peer still gets in", "[actors][security]") {
  node_pair p(30s, 8);  // the deadline plays no part here
  auto direct = open_idle(p.n1->rpc_port(), 20);
  auto caf = open_idle(p.n1->port(), 20);
  CHECK(closed_within(direct, 12, 5s) >= 12);  // the oldest beyond the cap of 8
  CHECK(closed_within(caf, 12, 5s) >= 12);
  // worker0 has not called worker1 yet: this opens and authenticates a new direct connection.
  CHECK(troupe::rpc_sync<int>(*p.n0, "worker1", "add", 2, 3, 5s) == 5);
  CHECK(count_closed(direct) <= 14);  // at most the new peer's eviction more
}

TEST_CASE("a CAF handshake header announcing a huge payload allocates nothing and the links survive", "[actors][security]") {
  node_pair p(2s, 64);
  CHECK(troupe::rpc_sync<int>(*p.n0, "worker1", "add", 1, 2, 5s) == 3);
  p.n0->store().set("k", "v");
  const long before = rss_kib();
  // BASP 0.17 header: operation client_handshake, padding, flags, payload_len (big-endian
  // 256 MiB), operation_data, source and destination actor: 32 bytes.
  std::vector<char> header(32, 0);
  header[0] = 0x01;
  header[4] = 0x10;
  CHECK(troupe::test::connection_dropped_after(p.n0->port(), header, 3s));
  CHECK(troupe::test::connection_dropped_after(p.n1->port(), header, 3s));
  CHECK(rss_kib() - before < 32 * 1024);
  CHECK(troupe::rpc_sync<int>(*p.n0, "worker1", "add", 2, 3, 5s) == 5);
  CHECK(p.n1->store().get("k", 5s) == "v");  // worker1's CAF link to the store host
}

TEST_CASE("a node at its file descriptor limit backs off accepting and still serves its peers", "[actors][security]") {
  auto child = troupe::spawn(1, [](int) {
    node_pair p(2s, 64);
    if (troupe::rpc_sync<int>(*p.n0, "worker1", "add", 1, 2, 5s) != 3) throw std::runtime_error("no first call");
    std::vector<int> socks;  // made now, connected once no fd is left for the nodes to accept with
    for (int i = 0; i < 4; ++i) socks.push_back(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    rlimit old{};
    ::getrlimit(RLIMIT_NOFILE, &old);
    rlimit low = old;
    low.rlim_cur = static_cast<rlim_t>(::dup(0) + 64);
    ::setrlimit(RLIMIT_NOFILE, &low);
    std::vector<int> filler;
    for (int fd; (fd = ::dup(0)) >= 0;) filler.push_back(fd);
    for (int i = 0; i < 4; ++i) {
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(i % 2 ? p.n1->rpc_port() : p.n1->port());
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      (void)::connect(socks[static_cast<std::size_t>(i)], reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    }
    rusage r0{}, r1{};
    ::getrusage(RUSAGE_SELF, &r0);
    const auto t0 = steady::now();
    std::this_thread::sleep_for(1s);  // a measurement window: the node must not spin
    ::getrusage(RUSAGE_SELF, &r1);
    const auto cpu_us = [](const rusage& r) {
      return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000000L + r.ru_utime.tv_usec + r.ru_stime.tv_usec;
    };
    const double cpu = static_cast<double>(cpu_us(r1) - cpu_us(r0)) / 1e6;
    const double wall = std::chrono::duration<double>(steady::now() - t0).count();
    if (cpu > 0.4 * wall) throw std::runtime_error("the node spins at its fd limit: " + std::to_string(cpu) + " s CPU in " + std::to_string(wall) + " s");
    if (troupe::rpc_sync<int>(*p.n0, "worker1", "add", 2, 3, 5s) != 5) throw std::runtime_error("a peer was not served");
    for (int fd : filler) ::close(fd);
    ::setrlimit(RLIMIT_NOFILE, &old);
    for (int fd : socks) ::close(fd);
  });
  CHECK(child.join(60s));
}
