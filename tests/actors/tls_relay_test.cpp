// The relays between a node's plain sockets and its TLS connections (Note [tls relay]).
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ddp/tls_test_certs.hpp"
#include "rpc/dial.hpp"
#include "tls_relay.hpp"

using namespace std::chrono_literals;
using troupe::errc;
using troupe::detail::tls_relays;

namespace {

using clock_type = std::chrono::steady_clock;

// A listener on 127.0.0.1, ephemeral port.
struct listener {
  listener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 16) == 0);
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~listener() { ::close(fd); }
  int accept_one() const {
    pollfd p{fd, POLLIN, 0};
    REQUIRE(::poll(&p, 1, 5000) == 1);
    return ::accept4(fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  }
  int fd = -1;
  std::uint16_t port = 0;
};

// Everything written to stderr while alive goes to a file; text() reads it.
class stderr_capture {
 public:
  stderr_capture() : path_("/tmp/troupe-tls-stderr-" + std::to_string(::getpid())) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    const int f = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ::dup2(f, 2);
    ::close(f);
  }
  ~stderr_capture() {
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    ::unlink(path_.c_str());
  }
  std::string text() const {
    std::ifstream in(path_);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  // Waits (bounded) until the captured text holds `what`.
  bool wait_for(const std::string& what, std::chrono::milliseconds bound = 5s) const {
    const auto end = clock_type::now() + bound;
    while (text().find(what) == std::string::npos) {
      if (clock_type::now() >= end) return false;
      std::this_thread::sleep_for(10ms);  // polling a file for an event, bounded
    }
    return true;
  }

 private:
  std::string path_;
  int saved_ = -1;
};

bool write_all(int fd, const char* p, std::size_t n) {
  const auto end = clock_type::now() + 10s;
  while (n > 0 && clock_type::now() < end) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
    } else if (k < 0 && errno == EAGAIN) {
      pollfd pf{fd, POLLOUT, 0};
      ::poll(&pf, 1, 100);
    } else {
      return false;
    }
  }
  return n == 0;
}

// Reads exactly n bytes (bounded); fewer when the peer closes first.
std::string read_n(int fd, std::size_t n, std::chrono::milliseconds bound = 10s) {
  std::string out;
  const auto end = clock_type::now() + bound;
  char buf[65536];
  while (out.size() < n && clock_type::now() < end) {
    pollfd pf{fd, POLLIN, 0};
    if (::poll(&pf, 1, 100) != 1) continue;
    const ssize_t k = ::recv(fd, buf, std::min(sizeof buf, n - out.size()), MSG_DONTWAIT);
    if (k == 0) break;
    if (k > 0) out.append(buf, static_cast<std::size_t>(k));
  }
  return out;
}

// Whether `fd` reads EOF within the bound (with nothing before it, unless `skip_data`).
bool reads_eof(int fd, std::chrono::milliseconds bound = 5s, bool skip_data = false) {
  const auto end = clock_type::now() + bound;
  while (clock_type::now() < end) {
    pollfd pf{fd, POLLIN, 0};
    if (::poll(&pf, 1, 100) != 1) continue;
    char c;
    const ssize_t k = ::recv(fd, &c, 1, MSG_DONTWAIT);
    if (k == 0) return true;
    if (k > 0 && !skip_data) return false;
  }
  return false;
}

std::string pattern(std::size_t n) {
  std::string s(n, '\0');
  for (std::size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + (i >> 10)) & 0xff);
  return s;
}

// A connection from `client` to the server relays behind `l`: {client's plain end, server's}.
std::pair<int, int> open_pair(tls_relays& client, tls_relays& server, const listener& l) {
  const int c = troupe::detail::dial_tcp("127.0.0.1", l.port, 5000ms);
  REQUIRE(c >= 0);
  const int s = server.accept(l.accept_one(), 5000ms);
  const int cp = client.connect(c, "the test server", clock_type::now() + 5s);
  return {cp, s};
}

}  // namespace

TEST_CASE("a tls relay carries bytes both ways and refuses a peer of another CA, naming its address, while it serves the others", "[actors][tls]") {
  troupe::test::tls_test_certs certs;
  listener l;
  tls_relays server("server", troupe::make_tls_context(certs.options()));
  tls_relays client("client", troupe::make_tls_context(certs.options()));
  tls_relays intruder("intruder", troupe::make_tls_context(certs.options("intruder", "ca")));

  auto [c1, s1] = open_pair(client, server, l);
  REQUIRE(write_all(c1, "ping", 4));
  CHECK(read_n(s1, 4) == "ping");
  const std::string big = pattern(3u << 20);
  std::thread writer([&, s = s1] { write_all(s, big.data(), big.size()); });
  CHECK(read_n(c1, big.size()) == big);
  writer.join();

  stderr_capture err;
  // A client whose certificate another CA signed: the server refuses it in the handshake.
  const int c2 = troupe::detail::dial_tcp("127.0.0.1", l.port, 5000ms);
  REQUIRE(c2 >= 0);
  const int s2 = server.accept(l.accept_one(), 5000ms);
  int p2 = -1;
  try {
    p2 = intruder.connect(c2, "the test server", clock_type::now() + 5s);  // TLS 1.3: the refusal comes after
    CHECK(reads_eof(p2));
    CHECK_FALSE(intruder.refusal(p2).empty());
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::unauthorized);  // TLS 1.2: the refusal ends the client's handshake
  }
  CHECK(reads_eof(s2));  // nothing from the intruder reaches the server's user
  CHECK(err.wait_for("server: refused a TLS connection from 127.0.0.1:"));
  // A client without TLS: its bytes never reach the server's user, and nothing falls back.
  const int c3 = troupe::detail::dial_tcp("127.0.0.1", l.port, 5000ms);
  REQUIRE(c3 >= 0);
  const int s3 = server.accept(l.accept_one(), 5000ms);
  const std::string plain("TRPG\0\0plain text that is not TLS", 32);
  REQUIRE(write_all(c3, plain.data(), plain.size()));
  CHECK(reads_eof(s3));
  CHECK(reads_eof(c3, 5s, true));  // the server's alert, then EOF

  // The first connection still works, and so does a new one.
  REQUIRE(write_all(s1, "pong", 4));
  CHECK(read_n(c1, 4) == "pong");
  auto [c4, s4] = open_pair(client, server, l);
  REQUIRE(write_all(c4, "again", 5));
  CHECK(read_n(s4, 5) == "again");

  // Closing a plain end closes the TLS connection: the other side's user reads EOF.
  ::close(c4);
  CHECK(reads_eof(s4));
  for (const int fd : {c1, s1, s2, p2, c3, s3, s4})
    if (fd >= 0) ::close(fd);
}

TEST_CASE("a tls client that does not trust the server's CA is refused in its handshake", "[actors][tls]") {
  troupe::test::tls_test_certs certs;
  listener l;
  tls_relays server("server", troupe::make_tls_context(certs.options()));
  tls_relays wary("wary", troupe::make_tls_context(certs.options("intruder", "other_ca")));
  const int c = troupe::detail::dial_tcp("127.0.0.1", l.port, 5000ms);
  REQUIRE(c >= 0);
  const int s = server.accept(l.accept_one(), 5000ms);
  try {
    wary.connect(c, "the test server", clock_type::now() + 5s);
    FAIL("the handshake succeeded");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::unauthorized);
    CHECK_THAT(e.message(), Catch::Contains("the test server") && Catch::Contains("certificate"));
  }
  CHECK(reads_eof(s));
  ::close(s);
}

TEST_CASE("stopping the relays ends their connections and joins their threads", "[actors][tls]") {
  troupe::test::tls_test_certs certs;
  listener l;
  tls_relays server("server", troupe::make_tls_context(certs.options()));
  tls_relays client("client", troupe::make_tls_context(certs.options()));
  auto [c, s] = open_pair(client, server, l);
  // A handshake that never gets its client: stop() ends it too.
  const int idle = troupe::detail::dial_tcp("127.0.0.1", l.port, 5000ms);
  const int half = server.accept(l.accept_one(), 60000ms);
  server.stop();
  CHECK(reads_eof(s));
  CHECK(reads_eof(c));
  CHECK(reads_eof(half));
  CHECK_THROWS_AS(server.accept(::socket(AF_INET, SOCK_STREAM, 0), 1000ms), troupe::error);
  for (const int fd : {c, s, idle, half}) ::close(fd);
}
