// Multi-process tests: nested RPC, concurrency, continuations, a frozen peer.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <future>
#include <mutex>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;
using troupe::errc;

namespace {

// Rank 1 relays to rank 2 and back to its caller (rank 0) from inside a user function.
void nested_child(int rank, troupe::test::port_pipe& pipe) {
  troupe::node n(troupe::test::test_options(rank, 3, pipe.read()));
  n.functions().add("add", [](int a, int b) { return a + b; });
  n.functions().add("relay", [&n](int x) {
    const int from_third = troupe::rpc_sync<int>(n, "worker2", "add", x, 100);
    const int from_caller = troupe::rpc_sync<int>(n, "worker0", "twice", x);
    return from_third + from_caller;
  });
  n.store().set("ready/" + std::to_string(rank), "1");
  n.store().get("done", 30s);
  n.shutdown(troupe::shutdown_mode::graceful, 10s);
}

}  // namespace

TEST_CASE("a user function can call a third worker and back its caller without deadlock", "[actors][rpc]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(2, [&](int i) { nested_child(i + 1, pipe); });
  troupe::node n(troupe::test::test_options(0, 3, 0));
  n.functions().add("twice", [](int x) { return 2 * x; });
  pipe.publish(n.port(), 2);
  n.store().wait({"ready/1", "ready/2"}, 10s);
  CHECK(troupe::rpc_sync<int>(n, "worker1", "relay", troupe::rpc::deadline{5s}, 5) == 105 + 10);
  // Several nested calls at once (fewer than the executor's threads on each side).
  std::vector<troupe::rpc::future<int>> fs;
  for (int i = 0; i < 3; ++i) fs.push_back(troupe::rpc_async<int>(n, "worker1", "relay", troupe::rpc::deadline{5s}, i));
  REQUIRE(troupe::rpc::wait_all(fs, 6s));
  for (int i = 0; i < 3; ++i) CHECK(fs[static_cast<std::size_t>(i)].get() == i + 100 + 2 * i);
  troupe::test::release_children(n);
  CHECK(children.join(10s));
}

TEST_CASE("many in-flight calls from several threads all complete with their own results", "[actors][rpc]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) {
    troupe::node n(troupe::test::test_options(1, 2, pipe.read()));
    n.functions().add("square", [](std::int64_t x) { return x * x; });
    n.store().set("ready/1", "1");
    n.store().get("done", 30s);
    n.shutdown(troupe::shutdown_mode::graceful, 10s);
  });
  troupe::node n(troupe::test::test_options(0, 2, 0));
  pipe.publish(n.port(), 1);
  n.store().wait({"ready/1"}, 10s);
  constexpr int threads = 4, per_thread = 500;
  std::atomic<int> wrong{0};
  std::mutex first_wrong_mutex;
  std::string first_wrong;  // what the first wrong call gave, for the failure message
  auto note_wrong = [&](const std::string& what) {
    ++wrong;
    std::lock_guard<std::mutex> lock(first_wrong_mutex);
    if (first_wrong.empty()) first_wrong = what;
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      std::vector<troupe::rpc::future<std::int64_t>> fs;
      for (int i = 0; i < per_thread; ++i) fs.push_back(troupe::rpc_async<std::int64_t>(n, "worker1", "square", std::int64_t{t * per_thread + i}));
      if (!troupe::rpc::wait_all(fs, 20s)) note_wrong("not all calls completed within 20 s");
      for (int i = 0; i < per_thread; ++i) {
        const std::int64_t x = t * per_thread + i;
        try {
          const std::int64_t got = fs[static_cast<std::size_t>(i)].get();
          if (got != x * x) note_wrong("square(" + std::to_string(x) + ") gave " + std::to_string(got));
        } catch (const troupe::error& e) {
          note_wrong("square(" + std::to_string(x) + ") failed: " + e.what());
        }
      }
    });
  for (auto& th : ts) th.join();
  INFO(first_wrong);
  CHECK(wrong == 0);
  // then() runs the continuation once the call completes.
  std::promise<std::int64_t> p;
  troupe::rpc_async<std::int64_t>(n, "worker1", "square", std::int64_t{9}).then([&p](troupe::rpc::future<std::int64_t> f) { p.set_value(f.get()); });
  auto got = p.get_future();
  REQUIRE(got.wait_for(5s) == std::future_status::ready);
  CHECK(got.get() == 81);
  // then_inline() runs on the completing thread, or at once when the call already completed.
  std::promise<std::int64_t> q;
  auto pending = troupe::rpc_async<std::int64_t>(n, "worker1", "square", std::int64_t{5});
  pending.then_inline([&q](troupe::rpc::future<std::int64_t> f) { q.set_value(f.get()); });
  auto inl = q.get_future();
  REQUIRE(inl.wait_for(5s) == std::future_status::ready);
  CHECK(inl.get() == 25);
  bool ran_at_once = false;
  pending.then_inline([&ran_at_once](troupe::rpc::future<std::int64_t> f) { ran_at_once = f.is_ready(); });
  CHECK(ran_at_once);
  troupe::test::release_children(n);
  CHECK(children.join(10s));
}

TEST_CASE("a SIGSTOPped peer is detected by the heartbeat and its calls fail with peer_lost", "[actors][rpc][supervision]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) {
    troupe::node n(troupe::test::test_options(1, 2, pipe.read()));
    n.functions().add("add", [](int a, int b) { return a + b; });
    n.store().set("ready/1", "1");
    n.store().get("done", 30s);
  });
  troupe::node n(troupe::test::test_options(0, 2, 0));
  pipe.publish(n.port(), 1);
  n.store().wait({"ready/1"}, 10s);
  REQUIRE(troupe::rpc_sync<int>(n, "worker1", "add", 1, 2) == 3);
  children.kill(0, SIGSTOP);
  // kill() only queues the stop: a thread running on the other core can still answer a call
  // that arrives at once. So wait until it is stopped; WUNTRACED reports the stop without reaping.
  int status = 0;
  REQUIRE(::waitpid(children.pids()[0], &status, WUNTRACED) == children.pids()[0]);
  REQUIRE(WIFSTOPPED(status));
  const auto t0 = std::chrono::steady_clock::now();
  auto f = troupe::rpc_async<int>(n, "worker1", "add", troupe::rpc::deadline{10s}, 1, 2);
  REQUIRE(f.wait(5s));
  const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  WARN("SIGSTOP -> peer_lost: " << ms << " ms");
  try {
    f.get();
    FAIL("call to a frozen peer succeeded");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::peer_lost);
    CHECK_THAT(e.message(), Catch::Contains("worker1"));
  }
  CHECK(ms < 3000);
  children.kill(0, SIGKILL);
  CHECK_THROWS_AS(children.join(10s), troupe::error);
}
