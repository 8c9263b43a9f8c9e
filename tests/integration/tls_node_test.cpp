// Nodes with mutual TLS (Note [tls relay]): RPC, remote actors and the store between TLS nodes.
// Peers without a valid certificate, or without TLS, are refused and the others keep working.
#include <catch2/catch.hpp>

#include <optional>
#include <set>

#include "ddp/tls_test_certs.hpp"
#include "integration/actor_child.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;
using namespace troupe::test;
using troupe::errc;

namespace {

troupe::node_options tls_node(int rank, std::uint16_t port, const troupe::tls_options& tls) {
  auto o = actor_options(rank, 2, port, false);  // Note [tls relay]: tensors go inline through TLS
  o.tls = tls;
  return o;
}

// Rank 1: an rpc function, a published echo actor, a store exchange; serves until "done".
void tls_worker(port_pipe& pipe, const troupe::tls_options& tls) {
  troupe::node n(tls_node(1, pipe.read(), tls));
  n.functions().add("add", [](int a, int b) { return a + b; });
  n.functions().add("echo_tensor", [](troupe::tensor t) { return t; });
  auto echo = n.system().spawn(echo_actor);
  troupe::publish_actor(n, echo, "echo");
  n.store().set("from/1", "hello over tls");
  n.store().set("ack/1", n.store().get("to/1", 30s) + "!");
  n.store().set("ready/1", "1");
  n.store().get("done", 60s);
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
  echo = nullptr;
  n.shutdown(troupe::shutdown_mode::graceful, 10s);
}

// A node that must be turned away: exits 0 only when joining fails with `want`.
void refused_node(port_pipe& pipe, const troupe::tls_options& tls, errc want) {
  auto o = tls_node(1, pipe.read(), tls);
  o.join_timeout = 3s;  // a refused TLS connection is retried as a start-up race until then
  try {
    troupe::node intruder(o);
  } catch (const troupe::error& e) {
    if (e.code() == want) return;
    throw;
  }
  throw std::runtime_error("a node without a valid certificate joined");
}

// A plain gate hello with the right token: a TLS node drops it (no fallback to plain text).
std::vector<char> plain_gate_hello(const std::string& token) {
  std::vector<char> h{'T', 'R', 'P', 'G', 0, static_cast<char>(token.size())};
  h.insert(h.end(), token.begin(), token.end());
  return h;
}

}  // namespace

TEST_CASE("rpc_sync and a remote actor request and a 16 MB echo and the store work between two nodes with TLS", "[actors][tls]") {
  tls_test_certs certs;
  port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { tls_worker(pipe, certs.options()); });
  troupe::node n(tls_node(0, 0, certs.options()));
  pipe.publish(n.port(), 1);
  CHECK(n.store().get("from/1", 20s) == "hello over tls");
  n.store().set("to/1", "back");
  CHECK(n.store().get("ack/1", 20s) == "back!");
  n.store().wait({"ready/1"}, 20s);
  CHECK(troupe::rpc_sync<int>(n, "worker1", "add", 2, 3) == 5);
  auto big = byte_pattern(std::int64_t{16} << 20, 3);  // fragments through the relays, no shared memory
  CHECK(same_bytes(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo_tensor", big, 60s), big));
  {
    auto echo = troupe::lookup_actor(n, "worker1", "echo", 10s);
    caf::scoped_actor self{n.system()};
    std::int32_t got = 0;
    self->request(echo, 10s, std::int32_t{41}).receive([&](std::int32_t r) { got = r; }, [&](caf::error& e) { FAIL(n.system().render(e)); });
    CHECK(got == 42);
  }
  CHECK(connection_dropped_after(n.port(), plain_gate_hello("test-token")));
  release_children(n);
  CHECK(children.join(20s));
}

TEST_CASE("a node with a certificate of another CA or without TLS is refused and the TLS nodes keep working", "[actors][tls]") {
  tls_test_certs certs;
  port_pipe pipe;
  auto children = troupe::spawn(4, [&](int i) {
    if (i == 0) tls_worker(pipe, certs.options());
    if (i == 1) refused_node(pipe, certs.options("intruder", "ca"), errc::unauthorized);       // its certificate: another CA
    if (i == 2) refused_node(pipe, certs.options("intruder", "other_ca"), errc::unauthorized);  // trusts another CA
    if (i == 3) refused_node(pipe, troupe::tls_options{}, errc::peer_lost);                     // no TLS: no gate verdict
  });
  troupe::node n(tls_node(0, 0, certs.options()));
  pipe.publish(n.port(), 4);
  CHECK(n.store().get("from/1", 20s) == "hello over tls");
  n.store().set("to/1", "x");
  n.store().wait({"ready/1"}, 20s);
  CHECK(troupe::rpc_sync<int>(n, "worker1", "add", 2, 3) == 5);
  // The three intruders were turned away by this node (each exits 0 only then).
  std::set<int> refused;
  for (int k = 0; k < 3; ++k)
    if (auto r = children.wait_any(30s)) refused.insert(*r);
  CHECK(refused == std::set<int>{1, 2, 3});
  CHECK(troupe::rpc_sync<int>(n, "worker1", "add", 4, 5) == 9);
  CHECK(n.store().get("ack/1", 5s) == "x!");
  release_children(n);
  CHECK(children.join(20s));
}

TEST_CASE("a TLS node does not join a node without TLS", "[actors][tls]") {
  tls_test_certs certs;
  port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { refused_node(pipe, certs.options(), errc::peer_lost); });
  auto o = actor_options(0, 2, 0, false);
  troupe::node n(o);
  pipe.publish(n.port(), 1);
  CHECK(children.wait_any(30s) == std::optional<int>(0));
  n.shutdown(troupe::shutdown_mode::immediate);  // rank 1 never joined
  CHECK(children.join(10s));
}

TEST_CASE("a node with a missing or mismatched TLS file fails to start with io_error naming the file", "[actors][tls]") {
  tls_test_certs certs;
  auto missing = certs.options();
  missing.key_file = certs.path("nowhere.key");
  std::string message;
  CHECK(code_of([&] { troupe::node n(tls_node(0, 0, missing)); }, &message) == errc::io_error);
  CHECK_THAT(message, Catch::Contains("nowhere.key"));
  auto mismatched = certs.options();
  mismatched.key_file = certs.path("intruder.key");
  CHECK(code_of([&] { troupe::node n(tls_node(0, 0, mismatched)); }, &message) == errc::io_error);
  CHECK_THAT(message, Catch::Contains("intruder.key"));
  auto not_pem = certs.options();
  not_pem.ca_file = "/proc/self/status";
  CHECK(code_of([&] { troupe::node n(tls_node(0, 0, not_pem)); }, &message) == errc::io_error);
  CHECK_THAT(message, Catch::Contains("/proc/self/status"));
  auto partial = certs.options();
  partial.ca_file.clear();
  CHECK(code_of([&] { troupe::node n(tls_node(0, 0, partial)); }, &message) == errc::bad_argument);
}
