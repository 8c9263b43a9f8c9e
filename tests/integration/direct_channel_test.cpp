// Multi-process tests of the direct RPC channel (Note [direct channel]): who may use it, and that
// a node's calls to itself take it too.
#include <algorithm>
#include <atomic>
#include <thread>
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

TEST_CASE("a node calls itself over its own direct channel, with the answers, errors and deadlines of a call between nodes", "[actors][rpc]") {
  std::atomic<bool> release{false};  // outlives the node, whose stop ends the stalled call that reads it
  troupe::node n(troupe::test::test_options(0, 1, 0));
  n.functions().add("twice", [](int x) { return 2 * x; });
  n.functions().add("nested", [&n](int x) { return troupe::rpc_sync<int>(n, "worker0", "twice", x, 5s) + 1; });
  n.functions().add("stall", [&release](int x) {
    for (int i = 0; i < 500 && !release.load(); ++i) std::this_thread::sleep_for(10ms);
    return x;
  });
  CHECK(troupe::rpc_sync<int>(n, "worker0", "twice", 21, 5s) == 42);
  CHECK(troupe::rpc_sync<int>(n, "worker0", "nested", 20, 5s) == 41);  // a served call calls this node again
  auto pending = troupe::rpc_async<int>(n, "worker0", "twice", 5, 5s);
  CHECK(pending.get() == 10);
  std::string text;
  try {
    troupe::rpc_sync<int>(n, "worker0", "nope", 1, 5s);
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::unknown_function);
    text = e.message();
  }
  CHECK_THAT(text, Catch::Contains("worker0") && Catch::Contains("nope"));
  const auto start = std::chrono::steady_clock::now();
  errc code = errc::ok;
  try {
    troupe::rpc_sync<int>(n, "worker0", "stall", 1, 200ms);
  } catch (const troupe::error& e) {
    code = e.code();
  }
  CHECK(code == errc::timeout);
  CHECK(std::chrono::steady_clock::now() - start < 3s);  // the deadline, not the function, ended it
  release = true;
  CHECK(troupe::rpc_sync<int>(n, "worker0", "twice", 4, 5s) == 8);  // the channel goes on
}
