// The TCP process group with mutual TLS (Note [tls]). It covers collectives and send/recv over
// it, a peer of another CA refused while the group forms, and clear errors for bad key files.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fstream>
#include <future>
#include <sstream>

#include "ddp/ddp_harness.hpp"
#include "ddp/tls_test_certs.hpp"
#include "troupe/actors/node_options.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/ddp/env_process_group.hpp"
#include "troupe/actors/tls_session.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

ddp::process_group_options tls_opts(const test::tls_test_certs& certs) {
  ddp::process_group_options o;
  o.transport = ddp::transport_kind::tcp;
  o.tcp_chunk_bytes = 16 << 10;
  o.tls = certs.options();
  return o;
}

// A client that connects to `port`, presents the other CA's certificate (trusting the job CA)
// and reports whether the server kept the connection open past the handshake.
bool intruder_kept(const test::tls_test_certs& certs, const std::string& host, int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  timeval tv{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  bool kept = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    try {
      tls_session s(make_tls_context(certs.options("intruder", "ca")), fd, tls_session::role::client);
      s.handshake(std::chrono::steady_clock::now() + 15s);
      char c;
      kept = s.read_some(&c, 1) > 0;  // the server refuses our certificate: an alert or EOF
    } catch (const error&) {
      kept = false;
    }
  }
  ::close(fd);
  return kept;
}

}  // namespace

TEST_CASE("a job with tls in its environment runs an rpc and an allreduce over the tls ring", "[ddp][process_group][tcp][tls]") {
  const test::tls_test_certs certs;
  const std::uint16_t port = troupe::test::free_port();
  const tls_options files = certs.options();
  auto ctx = spawn(2, [port, files](int rank) {
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", "2", 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    ::setenv("TROUPE_JOB_TOKEN", "tls-test-token", 1);
    ::setenv("TROUPE_TLS_CERT", files.cert_file.c_str(), 1);
    ::setenv("TROUPE_TLS_KEY", files.key_file.c_str(), 1);
    ::setenv("TROUPE_TLS_CA", files.ca_file.c_str(), 1);
    ddp::process_group_options o;
    o.transport = ddp::transport_kind::tcp;  // one host: the automatic choice would be shared memory
    ddp::env_process_group dist("tlsjob", o);
    dist.node().functions().add("add", [](int a, int b) { return a + b; });
    tensor t = full({1000}, static_cast<double>(rank + 1));
    dist.group().allreduce(t).wait(20s);  // rank 1 registered "add" before it entered
    test::expect(t.data<float>()[999] == 3.0f, "allreduce over the tls ring");
    if (rank == 0) test::expect(rpc_sync<int>(dist.node(), "worker1", "add", 2, 3, 20s) == 5, "rpc in a tls job");
    dist.shutdown(20s);
  });
  REQUIRE(ctx.join(90s));
}

TEST_CASE("a tcp group with mutual tls runs allreduce, broadcast and send/recv on 3 ranks", "[ddp][process_group][tcp][tls]") {
  const test::tls_test_certs certs;
  REQUIRE(test::run_group(3, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    const int w = pg.world_size();
    tensor t = full({100'000}, static_cast<double>(rank + 1), {dtype::float64});  // several chunks
    pg.allreduce(t).wait(20s);
    test::expect(t.data<double>()[0] == 6.0 && t.data<double>()[99'999] == 6.0, "allreduce sums over tls");
    tensor b = full({10}, static_cast<double>(rank), {dtype::float64});
    pg.broadcast(b, 2).wait(20s);
    test::expect(b.data<double>()[9] == 2.0, "broadcast from rank 2 over tls");
    tensor in = zeros({300'000}, {dtype::float64});
    ddp::work s = pg.send(full({300'000}, static_cast<double>(rank), {dtype::float64}), (rank + 1) % w, 3);
    pg.recv(in, (rank + w - 1) % w, 3).wait(20s);
    s.wait(20s);
    test::expect(in.data<double>()[299'999] == static_cast<double>((rank + w - 1) % w), "recv over tls");
  }, tls_opts(certs)));
}

TEST_CASE("a peer with a certificate of another CA is refused and the tls group still forms", "[ddp][process_group][tcp][tls]") {
  const test::tls_test_certs certs;
  test::temp_store dir;
  const ddp::file_store store = dir.store;
  const auto opts = tls_opts(certs);
  auto rank1 = spawn(1, [store, opts](int) {
    ddp::process_group pg(store, 1, 2, "test", opts);
    tensor t = full({10}, 2.0);
    pg.allreduce(t).wait(20s);
    test::expect(t.data<float>()[0] == 3.0f, "rank 1 sums");
  });
  // Rank 1 published its port and waits for rank 0's key: the intruder waits in its backlog and
  // is the first connection rank 1 accepts once rank 0 exists.
  std::istringstream in(store.get("troupe/pg/test/tcp/1", 20s));
  std::string host;
  int port = 0;
  in >> host >> port;
  auto intruder = std::async(std::launch::async, [&] { return intruder_kept(certs, host, port); });
  REQUIRE(intruder.wait_for(200ms) == std::future_status::timeout);  // its handshake waits for rank 1
  ddp::process_group pg(store, 0, 2, "test", opts);
  tensor t = full({10}, 1.0);
  pg.allreduce(t).wait(20s);
  CHECK(t.data<float>()[0] == 3.0f);
  REQUIRE(intruder.wait_for(20s) == std::future_status::ready);
  CHECK_FALSE(intruder.get());
  REQUIRE(rank1.join(20s));
}

TEST_CASE("a tls group whose key file is missing, not PEM or not the certificate's fails at once naming the file", "[ddp][process_group][tcp][tls]") {
  const test::tls_test_certs certs;
  test::temp_store dir;
  auto expect_refused = [&](ddp::process_group_options o, const std::string& names, errc code) {
    try {
      ddp::process_group pg(dir.store, 0, 2, "test", o);
      FAIL("the group formed");
    } catch (const error& e) {
      INFO(e.what());
      CHECK(e.code() == code);
      CHECK(e.message().find(names) != std::string::npos);
    }
  };
  auto o = tls_opts(certs);
  o.tls.key_file = certs.path("missing.key");
  expect_refused(o, "key_file '" + certs.path("missing.key") + "'", errc::io_error);
  std::ofstream(certs.path("garbage.key")) << "not a key\n";
  o.tls.key_file = certs.path("garbage.key");
  expect_refused(o, "key_file '" + certs.path("garbage.key") + "'", errc::io_error);
  o.tls.key_file = certs.path("intruder.key");
  expect_refused(o, "key_file '" + certs.path("intruder.key") + "'", errc::io_error);  // another certificate's key
  o = tls_opts(certs);
  o.tls.ca_file = certs.path("missing-ca.crt");
  expect_refused(o, "ca_file '" + certs.path("missing-ca.crt") + "'", errc::io_error);
  o.tls.ca_file.clear();
  expect_refused(o, "ca_file is empty", errc::bad_argument);
}

TEST_CASE("node_options::from_env reads the tls files from TROUPE_TLS_CERT, TROUPE_TLS_KEY and TROUPE_TLS_CA", "[ddp][tls]") {
  ::setenv("TROUPE_TLS_CERT", "/certs/a.crt", 1);
  ::setenv("TROUPE_TLS_KEY", "/certs/a.key", 1);
  ::setenv("TROUPE_TLS_CA", "/certs/ca.crt", 1);
  const node_options o = node_options::from_env();
  ::unsetenv("TROUPE_TLS_CERT");
  ::unsetenv("TROUPE_TLS_KEY");
  ::unsetenv("TROUPE_TLS_CA");
  CHECK(o.tls.cert_file == "/certs/a.crt");
  CHECK(o.tls.key_file == "/certs/a.key");
  CHECK(o.tls.ca_file == "/certs/ca.crt");
  CHECK_FALSE(node_options::from_env().tls.enabled());
}
