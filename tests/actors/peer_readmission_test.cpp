// Re-admission of a lost peer's replacement (Note [lost peer re-admission], Note [CAF connect
// tick] in actors/src/peer_dialer.hpp), with two nodes in this process. The replacement of
// worker1 is reached in two cases: its first answer comes late, or the store still names an
// address that does not answer when the call starts.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "troupe/actors/peer_events.hpp"
#include "troupe/actors/rpc/api.hpp"

using namespace std::chrono_literals;
using troupe::errc;

namespace {

troupe::node_options of_two(int rank, std::uint16_t master_port) {
  troupe::node_options o;
  o.job_token = "t";
  o.default_timeout = 5s;
  o.world_size = 2;
  o.rank = rank;
  o.master_port = master_port;
  return o;
}

// A loopback listener on an ephemeral port. Each accepted connection is handed to `serve` on a
// thread of its own; `serve` owns the socket. Stops and joins every thread on destruction.
class test_listener {
 public:
  using server = std::function<void(int fd, int index, const std::atomic<bool>& stop)>;
  explicit test_listener(server serve) : serve_(std::move(serve)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(fd_ >= 0);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd_, 8) == 0);
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
    accepter_ = std::thread([this] { accept_loop(); });
  }
  ~test_listener() {
    stop_ = true;
    accepter_.join();
    for (auto& t : servers_) t.join();
    ::close(fd_);
  }
  test_listener(const test_listener&) = delete;
  test_listener& operator=(const test_listener&) = delete;
  std::uint16_t port() const { return port_; }
  int accepted() const { return accepted_; }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) != 1) continue;
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) continue;
      const int index = accepted_++;
      servers_.emplace_back([this, c, index] { serve_(c, index, stop_); });
    }
  }
  server serve_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> accepted_{0};
  std::thread accepter_;
  std::vector<std::thread> servers_;  // only the accept thread adds, and only before the join
};

int dial_loopback(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
  if (fd >= 0) ::close(fd);
  return -1;
}

// Relays `client` to the node listening on `port` until either side closes. `hold`: after the
// node's first byte (the gate's verdict), its later bytes wait that long, as from a peer that
// answers late.
void relay(int client, std::uint16_t port, std::chrono::milliseconds hold, const std::atomic<bool>& stop) {
  const int node = dial_loopback(port);
  bool first = true;
  char buf[4096];
  for (bool open = node >= 0; open && !stop;) {
    pollfd p[2] = {{client, POLLIN, 0}, {node, POLLIN, 0}};
    if (::poll(p, 2, 20) <= 0) continue;
    for (int i = 0; i < 2 && open; ++i) {
      if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const bool from_node = i == 1;
      const ssize_t n = ::recv(p[i].fd, buf, from_node && first ? 1 : sizeof buf, 0);
      open = n > 0 && ::send(from_node ? client : node, buf, static_cast<std::size_t>(n), MSG_NOSIGNAL) == n;
      if (open && from_node && first) {
        first = false;
        std::this_thread::sleep_for(hold);  // the injected lateness, not a synchronisation
      }
    }
  }
  if (node >= 0) ::close(node);
  ::close(client);
}

// worker1 of a two-node job is lost to worker0 and replaced; `n1` is the replacement.
struct replaced_peer {
  troupe::node n0{of_two(0, 0)};
  std::optional<troupe::node> n1;

  replaced_peer() {
    std::promise<void> lost;
    auto seen = lost.get_future();
    std::once_flag once;
    auto sub = troupe::peer_events::subscribe(n0.peer_losses(), [&](const troupe::peer_loss& l) {
      if (l.worker == "worker1") std::call_once(once, [&] { lost.set_value(); });
    });
    {
      troupe::node first(of_two(1, n0.port()));
      first.functions().add("inc", [](int x) { return x + 1; });
      REQUIRE(troupe::rpc_sync<int>(n0, "worker1", "inc", 1, 5s) == 2);
      first.shutdown(troupe::shutdown_mode::immediate);
    }
    REQUIRE(seen.wait_for(10s) == std::future_status::ready);  // worker0 forgot the first incarnation
    n1.emplace(of_two(1, n0.port()));
    n1->functions().add("inc", [](int x) { return x + 10; });
  }
};

}  // namespace

TEST_CASE("a lost peer's replacement whose first answer comes after CAF's next heartbeat tick is still reached",
          "[actors][node][readmission]") {
  // The relay passes the gate's verdict, then holds the replacement's CAF handshake past two
  // heartbeat ticks (100 ms each): CAF drops that first connect with connection_timeout. The
  // relay passes later connections at once.
  replaced_peer job;
  const std::uint16_t target = job.n1->port();
  test_listener late([target](int fd, int index, const std::atomic<bool>& stop) { relay(fd, target, index == 0 ? 300ms : 0ms, stop); });
  job.n0.store().set("troupe/addr/worker1", "127.0.0.1:" + std::to_string(late.port()));
  CHECK(troupe::rpc_sync<int>(job.n0, "worker1", "inc", 1, 5s) == 11);
  CHECK(late.accepted() >= 2);  // the first connect was dropped and dialled again
}

TEST_CASE("a call to a lost peer tries the replacement's address when the store names a newer one after a failed dial",
          "[actors][node][readmission]") {
  // The store names an address that accepts and closes without a gate verdict; the replacement
  // publishes its own address just before that close.
  replaced_peer job;
  const std::string real = "127.0.0.1:" + std::to_string(job.n1->port());
  troupe::node& replacement = *job.n1;
  test_listener stale([&replacement, real](int fd, int, const std::atomic<bool>&) {
    replacement.store().set("troupe/addr/worker1", real);
    ::close(fd);
  });
  job.n0.store().set("troupe/addr/worker1", "127.0.0.1:" + std::to_string(stale.port()));
  CHECK(troupe::rpc_sync<int>(job.n0, "worker1", "inc", 1, 5s) == 11);
  CHECK(stale.accepted() == 1);
}

TEST_CASE("a call to a lost peer that answers at no address fails at once with peer_lost naming it and the address",
          "[actors][node][readmission]") {
  replaced_peer job;
  std::uint16_t closed = 0;
  {
    test_listener gone([](int fd, int, const std::atomic<bool>&) { ::close(fd); });
    closed = gone.port();
  }
  job.n0.store().set("troupe/addr/worker1", "127.0.0.1:" + std::to_string(closed));
  const auto t0 = std::chrono::steady_clock::now();
  try {
    troupe::rpc_sync<int>(job.n0, "worker1", "inc", 1, 5s);
    FAIL("a call to an address nobody listens at succeeded");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::peer_lost);
    CHECK_THAT(e.message(), Catch::Contains("worker1") && Catch::Contains("127.0.0.1:" + std::to_string(closed)));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);  // no wait for the window: the dial was refused
}
