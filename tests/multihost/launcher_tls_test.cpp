// The launchers' channel under mutual TLS (Note [launcher channel]):
// - two launchers with TLS form a job between namespace hosts;
// - intruders without TLS or with a certificate of another CA are refused while the job's
//   launchers keep waiting;
// - the join token never goes out in clear.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <catch2/catch.hpp>

#include "ddp/tls_test_certs.hpp"
#include "multihost/two_host_job.hpp"

using namespace std::chrono_literals;
using troupe::test::host_process;
using troupe::test::netns_bed;

namespace {

std::vector<std::string> tls_flags(const troupe::tls_options& t) {
  return {"--tls-cert", t.cert_file, "--tls-key", t.key_file, "--tls-ca", t.ca_file, "--join-timeout-s", "40"};
}

// A TCP listener on 127.0.0.1 that plays the master launcher and records what a node sends.
class fake_master {
 public:
  fake_master() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd_, 4) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw troupe::error(troupe::errc::io_error, "fake master: cannot listen");
    port_ = ntohs(a.sin_port);
  }
  ~fake_master() {
    if (conn_ >= 0) ::close(conn_);
    ::close(fd_);
  }
  fake_master(const fake_master&) = delete;
  fake_master& operator=(const fake_master&) = delete;
  int port() const { return port_; }

  /// Accepts the node's connection and reads until `enough` says the bytes are complete, or the
  /// node closes, or 20 s pass. Returns what it sent.
  template <class Enough>
  std::string receive(Enough enough) {
    const auto end = std::chrono::steady_clock::now() + 20s;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 20000) != 1) return {};
    conn_ = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    std::string got;
    while (conn_ >= 0 && !enough(got) && std::chrono::steady_clock::now() < end) {
      pollfd c{conn_, POLLIN, 0};
      if (::poll(&c, 1, 200) != 1) continue;
      char buf[4096];
      const auto n = ::recv(conn_, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
    return got;
  }
  /// Closes the node's connection (it then fails to join).
  void hang_up() {
    if (conn_ >= 0) ::close(conn_);
    conn_ = -1;
  }

 private:
  int fd_ = -1;
  int conn_ = -1;
  int port_ = 0;
};

std::vector<std::string> node_argv(int master_port, const std::vector<std::string>& extra) {
  std::vector<std::string> a{TROUPE_RUN_PATH, "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1", "--master-port",
                             std::to_string(master_port), "--join-timeout-s", "20", "--timeout-s", "30"};
  a.insert(a.end(), extra.begin(), extra.end());
  a.insert(a.end(), {"--", "/bin/true"});
  return a;
}

}  // namespace

TEST_CASE("launchers with TLS form a job and refuse a launcher without TLS or with a certificate of another CA",
          "[multihost][launcher][tls]") {
  netns_bed bed(2);
  troupe::test::require_bed(bed);
  const troupe::test::tls_test_certs certs;
  const std::vector<std::string> prog{"/bin/sh", "-c", "echo \"rank $RANK got the CA $TROUPE_TLS_CA\""};
  const std::vector<std::string> token{"TROUPE_JOB_TOKEN=mh-job-token"};
  auto master = bed.start(0, troupe::test::launcher_argv(bed, 0, 1, prog, 60, tls_flags(certs.options())), token);
  // Intruders that know the token, one after the other: the master refuses each, then the
  // job's node joins.
  auto plain = bed.start(1, troupe::test::launcher_argv(bed, 1, 1, prog, 30, {"--join-timeout-s", "20"}), token);
  const int plain_code = plain.wait(30s);
  auto foreign_cert = bed.start(1, troupe::test::launcher_argv(bed, 1, 1, prog, 30, tls_flags(certs.options("intruder", "ca"))), token);
  const int foreign_cert_code = foreign_cert.wait(30s);
  auto foreign_ca = bed.start(1, troupe::test::launcher_argv(bed, 1, 1, prog, 30, tls_flags(certs.options("intruder", "other_ca"))), token);
  const int foreign_ca_code = foreign_ca.wait(30s);
  auto node = bed.start(1, troupe::test::launcher_argv(bed, 1, 1, prog, 60, tls_flags(certs.options())), token);
  CHECK(node.wait(60s) == 0);
  CHECK(master.wait(60s) == 0);
  INFO("--- master ---\n" << master.output() << "--- no TLS ---\n" << plain.output() << "--- foreign certificate ---\n"
                          << foreign_cert.output() << "--- foreign CA ---\n" << foreign_ca.output() << "--- node ---\n" << node.output());
  CHECK(plain_code == 1);
  CHECK(foreign_cert_code == 1);
  CHECK(foreign_ca_code == 1);
  CHECK_THAT(plain.output(), Catch::Contains("the master launcher at 10.77.0.1:29400") && Catch::Contains("--tls-cert"));
  CHECK_THAT(foreign_cert.output(), Catch::Contains("the master launcher at 10.77.0.1:29400 refused this launcher's TLS certificate"));
  CHECK_THAT(foreign_ca.output(), Catch::Contains("no TLS connection with the master launcher at 10.77.0.1:29400") &&
                                      Catch::Contains("certificate verify failed"));
  // The master names each refused connection and its address, and the job ran with TLS.
  const std::string m = master.output();
  std::size_t refusals = 0;
  for (auto at = m.find("refused a TLS connection from 10.77.0.2:"); at != std::string::npos;
       at = m.find("refused a TLS connection from 10.77.0.2:", at + 1))
    ++refusals;
  CHECK(refusals >= 2);
  CHECK_THAT(m, Catch::Contains("rank 0 got the CA " + certs.path("ca.crt")));
  CHECK_THAT(node.output(), Catch::Contains("rank 1 got the CA " + certs.path("ca.crt")));
}

TEST_CASE("a launcher with TLS sends its join token only inside TLS and one without TLS sends it in clear",
          "[multihost][launcher][tls]") {
  const troupe::test::tls_test_certs certs;
  const std::string secret = "launcher-token-4f1c9e";
  // Without TLS the join line carries the token in clear: what this test looks for is visible.
  {
    fake_master master;
    auto node = troupe::test::start_here(node_argv(master.port(), {}), {"TROUPE_JOB_TOKEN=" + secret});
    const std::string got = master.receive([](const std::string& s) { return s.find('\n') != std::string::npos; });
    master.hang_up();
    CHECK(node.wait(30s) == 1);
    INFO(node.output());
    CHECK_THAT(got, Catch::StartsWith("join " + secret + " 1 1 "));
  }
  // With TLS the first record is a handshake; the token is not in it, and the launcher tells
  // that the master spoke no TLS.
  fake_master master;
  auto node = troupe::test::start_here(node_argv(master.port(), tls_flags(certs.options())), {"TROUPE_JOB_TOKEN=" + secret});
  const std::string got = master.receive([](const std::string& s) {  // one whole TLS record
    return s.size() >= 5 && s.size() >= 5 + ((std::size_t{static_cast<unsigned char>(s[3])} << 8) | static_cast<unsigned char>(s[4]));
  });
  master.hang_up();
  CHECK(node.wait(30s) == 1);
  INFO(node.output());
  REQUIRE(got.size() >= 5);
  CHECK(got[0] == '\x16');  // a TLS handshake record (the ClientHello)
  CHECK(got.find(secret) == std::string::npos);
  CHECK_THAT(node.output(), Catch::Contains("no TLS connection with the master launcher at 127.0.0.1:" + std::to_string(master.port())) &&
                                Catch::Contains("the master may have no TLS"));
}
