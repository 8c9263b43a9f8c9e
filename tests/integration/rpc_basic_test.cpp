// Multi-process RPC tests: the vertical slice (store, rpc_sync, errors, peer loss).
#include <signal.h>

#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;
using troupe::errc;

namespace {

troupe::rpc::registry worker_functions() {
  troupe::rpc::registry reg;
  reg.add("add", [](int a, int b) { return a + b; });
  reg.add("concat", [](std::string a, std::string b) { return a + b; });
  reg.add("fail", [](std::string why) -> int { throw std::runtime_error("user failure: " + why); });
  reg.add("block", [](int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));  // the work being timed out, not a sync
    return ms;
  });
  return reg;
}

// Child rank: joins, serves until rank 0 says "done", then leaves gracefully.
void serve_until_done(int rank, int world, troupe::test::port_pipe& pipe) {
  troupe::node n(troupe::test::test_options(rank, world, pipe.read()), worker_functions());
  n.store().set("ready/" + std::to_string(rank), "1");
  n.store().get("done", 20s);
  n.shutdown(troupe::shutdown_mode::graceful, 10s);
}

std::vector<std::string> ready_keys(int world) {
  std::vector<std::string> keys;
  for (int r = 1; r < world; ++r) keys.push_back("ready/" + std::to_string(r));
  return keys;
}

template <class F>
errc error_code_of(F&& f) {
  try {
    f();
  } catch (const troupe::error& e) {
    return e.code();
  }
  return errc::ok;
}

}  // namespace

TEST_CASE("rpc_sync of an int to another process returns the remote result", "[actors][rpc]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int i) { serve_until_done(i + 1, 2, pipe); });
  troupe::node n(troupe::test::test_options(0, 2, 0));
  pipe.publish(n.port(), 1);
  n.store().wait(ready_keys(2), 10s);
  CHECK(troupe::rpc_sync<int>(n, "worker1", "add", 40, 2) == 42);
  CHECK(troupe::rpc_sync<std::string>(n, "worker1", "concat", std::string("ab"), "cd") == "abcd");
  troupe::test::release_children(n);
  CHECK(children.join(10s));
}

TEST_CASE("each rpc error code reaches the caller with its worker and function", "[actors][rpc]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int i) { serve_until_done(i + 1, 2, pipe); });
  troupe::node n(troupe::test::test_options(0, 2, 0));
  pipe.publish(n.port(), 1);
  n.store().wait(ready_keys(2), 10s);

  CHECK(error_code_of([&] { troupe::rpc_sync<int>(n, "worker1", "nope", 1); }) == errc::unknown_function);
  try {
    troupe::rpc_sync<int>(n, "worker1", "add", 1, std::string("x"));
    FAIL("bad argument accepted");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::bad_argument);
    CHECK_THAT(e.message(), Catch::Contains("argument 1") && Catch::Contains("expected int32") && Catch::Contains("got string"));
  }
  try {
    troupe::rpc_sync<int>(n, "worker1", "fail", std::string("boom"));
    FAIL("remote exception lost");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::remote_exception);
    CHECK_THAT(e.message(), Catch::Contains("user failure: boom") && Catch::Contains("worker1") && Catch::Contains("'fail'"));
  }
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(error_code_of([&] { troupe::rpc_sync<int>(n, "worker1", "block", troupe::rpc::deadline{100ms}, 1000); }) == errc::timeout);
  CHECK(std::chrono::steady_clock::now() - t0 < 900ms);
  CHECK(error_code_of([&] { troupe::rpc_sync<int>(n, "nobody", "add", troupe::rpc::deadline{200ms}, 1, 2); }) == errc::peer_lost);
  CHECK(troupe::rpc_sync<int>(n, "worker1", "add", 1, 2) == 3);  // still serving
  troupe::test::release_children(n);
  CHECK(children.join(10s));
}

TEST_CASE("a SIGKILLed peer fails its pending call with peer_lost naming it within the bound", "[actors][rpc][supervision]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(2, [&](int i) { serve_until_done(i + 1, 3, pipe); });
  troupe::node n(troupe::test::test_options(0, 3, 0));
  pipe.publish(n.port(), 2);
  n.store().wait(ready_keys(3), 10s);
  auto f = troupe::rpc_async<int>(n, "worker1", "block", 5000);
  CHECK(troupe::rpc_sync<int>(n, "worker2", "add", 1, 1) == 2);
  const auto t0 = std::chrono::steady_clock::now();
  children.kill(0, SIGKILL);
  REQUIRE(f.wait(2s));
  const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  try {
    f.get();
    FAIL("call to a killed peer succeeded");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::peer_lost);
    CHECK_THAT(e.message(), Catch::Contains("worker1"));
  }
  WARN("SIGKILL -> peer_lost: " << ms << " ms");
  CHECK(ms < 2000);
  CHECK(troupe::rpc_sync<int>(n, "worker2", "add", 2, 2) == 4);  // the other peer keeps working
  CHECK(error_code_of([&] { troupe::rpc_sync<int>(n, "worker1", "add", troupe::rpc::deadline{500ms}, 1, 1); }) == errc::peer_lost);
  // A later call with the default (10 s) deadline fails at once too: the node remembers the loss.
  const auto t1 = std::chrono::steady_clock::now();
  CHECK(error_code_of([&] { troupe::rpc_sync<int>(n, "worker1", "add", 1, 1); }) == errc::peer_lost);
  CHECK(std::chrono::steady_clock::now() - t1 < 1s);
  n.store().set("done", "1");
  CHECK_THROWS_AS(children.join(10s), troupe::error);  // rank 1 died by SIGKILL
}
