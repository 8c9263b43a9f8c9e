// Multi-process tests of the direct RPC channel (Note [rpc fast path]): who may use it, and that
// it answers like the CAF path.
#include <algorithm>
#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;
using troupe::errc;

namespace {

// A direct-channel frame header (u32 length, u8 kind) followed by `body` filler bytes.
std::vector<char> frame(std::uint32_t len, std::uint8_t kind, std::size_t body) {
  std::vector<char> f(5 + body, 'x');
  const char head[5] = {static_cast<char>(len), static_cast<char>(len >> 8), static_cast<char>(len >> 16), static_cast<char>(len >> 24),
                        static_cast<char>(kind)};
  std::copy(head, head + 5, f.begin());
  return f;
}

// worker1: "add", and its direct port in the store.
void child(int rank, troupe::test::port_pipe& pipe) {
  troupe::node n(troupe::test::test_options(rank, 3, pipe.read()));
  n.functions().add("add", [](int a, int b) { return a + b; });
  n.functions().add("ask", [&n](int x) { return troupe::rpc_sync<int>(n, "worker0", "twice", x, 5s); });
  n.store().set("rpc_port/" + std::to_string(rank), std::to_string(n.rpc_port()));
  n.store().get("done", 30s);
  n.shutdown(troupe::shutdown_mode::graceful, 10s);
}

}  // namespace

TEST_CASE("the direct rpc port drops a connection that does not present a valid ticket first and keeps serving", "[actors][rpc][security]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(2, [&](int i) { child(i + 1, pipe); });
  troupe::node n(troupe::test::test_options(0, 3, 0));
  pipe.publish(n.port(), 2);
  const auto port = static_cast<std::uint16_t>(std::stoi(n.store().get("rpc_port/1", 10s)));
  REQUIRE(port != 0);
  CHECK(troupe::test::connection_dropped_after(port, {'G', 'E', 'T', ' ', '/', '\r', '\n', '\r', '\n'}));  // garbage
  CHECK(troupe::test::connection_dropped_after(port, frame(4, 0, 4)));                  // a request before any ticket
  CHECK(troupe::test::connection_dropped_after(port, frame(2u << 30, 2, 0)));          // an oversized frame
  CHECK(troupe::test::connection_dropped_after(port, frame(6, 2, 6)));                  // an auth frame that does not parse
  CHECK(troupe::rpc_sync<int>(n, "worker1", "add", 2, 3, 5s) == 5);  // served as before
  troupe::test::release_children(n);
  CHECK(children.join(10s));
}

TEST_CASE("a node without the direct channel calls and serves a node with it through the CAF path", "[actors][rpc]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(2, [&](int i) { child(i + 1, pipe); });
  auto opts = troupe::test::test_options(0, 3, 0);
  opts.rpc_fast_path = false;
  troupe::node n(opts);
  n.functions().add("twice", [](int x) { return 2 * x; });
  pipe.publish(n.port(), 2);
  CHECK(n.rpc_port() == 0);
  n.store().wait({"rpc_port/1", "rpc_port/2"}, 10s);
  CHECK(troupe::rpc_sync<int>(n, "worker1", "add", 20, 22, 5s) == 42);
  CHECK(troupe::rpc_sync<int>(n, "worker2", "ask", 21, 5s) == 42);  // worker2 calls back over CAF
  std::string text;
  try {
    troupe::rpc_sync<int>(n, "worker1", "nope", 1, 5s);
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::unknown_function);
    text = e.message();
  }
  CHECK_THAT(text, Catch::Contains("worker1") && Catch::Contains("nope"));
  troupe::test::release_children(n);
  CHECK(children.join(10s));
}
