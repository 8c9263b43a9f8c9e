// Single-process tests of a node: local store, calls to itself, the transport hook, shutdown.
#include <dirent.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include <catch2/catch.hpp>

#include "troupe/actors/rpc/api.hpp"

using namespace std::chrono_literals;
using troupe::errc;

namespace {

int thread_count() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/task")) {
    while (auto* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n;
}

// The thread count once it is back to `want`, or what it is after 1 s. pthread_join returns when
// the exiting thread clears its tid, a moment before the kernel drops it from /proc/self/task.
int thread_count_settled(int want) {
  const auto end = std::chrono::steady_clock::now() + 1s;
  int n = thread_count();
  while (n != want && std::chrono::steady_clock::now() < end) {
    std::this_thread::yield();
    n = thread_count();
  }
  return n;
}

troupe::node_options solo() {
  troupe::node_options o;
  o.job_token = "t";
  o.default_timeout = 5s;
  return o;
}

// Rank 0 of a job of two nodes in this process: both claim the same world size (Note [worker identity]).
troupe::node_options first_of_two() {
  auto o = solo();
  o.world_size = 2;
  return o;
}

// Rank 1 of that job, joining `first`.
troupe::node_options second_of_two(const troupe::node& first) {
  auto o = first_of_two();
  o.rank = 1;
  o.master_port = first.port();
  return o;
}

// Drops the first request it sees, duplicates the second, counts everything.
struct counting_hook : troupe::transport_hook {
  std::atomic<int> sent{0}, received{0}, requests{0};
  troupe::transport_decision on_send(troupe::envelope& m) override {
    ++sent;
    if (m.kind != troupe::message_kind::rpc_request) return {};
    const int n = ++requests;
    return {n == 1 ? 0 : n == 2 ? 2 : 1, 0ms};
  }
  troupe::transport_decision on_receive(troupe::envelope&) override {
    ++received;
    return {};
  }
};

}  // namespace

TEST_CASE("a single node serves its own store and calls to itself", "[actors][node]") {
  troupe::node n(solo());
  n.functions().add("neg", [](double x) { return -x; });
  CHECK(n.info().name == "worker0");
  CHECK(n.port() != 0);
  n.store().set("a", "1");
  CHECK(n.store().get("a", 1s) == "1");
  CHECK(troupe::rpc_sync<double>(n, "worker0", "neg", 2.5) == -2.5);
  n.shutdown(troupe::shutdown_mode::graceful, 2s);
}

TEST_CASE("every call passes the transport hook, which can drop and duplicate", "[actors][node][transport]") {
  auto hook = std::make_shared<counting_hook>();
  troupe::node n(solo(), {}, hook);
  std::atomic<int> runs{0};
  n.functions().add("count", [&runs](int x) {
    ++runs;
    return x;
  });
  try {
    troupe::rpc_sync<int>(n, "worker0", "count", troupe::rpc::deadline{100ms}, 1);
    FAIL("a dropped request completed");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::timeout);
  }
  CHECK(troupe::rpc_sync<int>(n, "worker0", "count", 2) == 2);  // duplicated: runs twice, completes once
  CHECK(troupe::rpc_sync<int>(n, "worker0", "count", 3) == 3);
  n.shutdown(troupe::shutdown_mode::immediate);
  CHECK(runs == 3);
  CHECK(hook->requests == 3);
  CHECK(hook->received >= 3);
}

TEST_CASE("after shutdown no thread of the node is left and calls fail with invalid_state", "[actors][node][shutdown]") {
  const int before = thread_count();
  {
    troupe::node n(solo());
    n.functions().add("slow", [](int ms) {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));  // the work in flight at shutdown
      return ms;
    });
    auto f = troupe::rpc_async<int>(n, "worker0", "slow", 50);
    CHECK(thread_count() > before);
    n.shutdown(troupe::shutdown_mode::immediate);
    REQUIRE(f.wait(2s));
    auto g = troupe::rpc_async<int>(n, "worker0", "slow", 1);
    REQUIRE(g.is_ready());
    try {
      g.get();
      FAIL("a call after shutdown succeeded");
    } catch (const troupe::error& e) {
      CHECK(e.code() == errc::invalid_state);
    }
    CHECK(thread_count_settled(before) == before);
  }
  CHECK(thread_count_settled(before) == before);
}

TEST_CASE("node options take the launcher environment as defaults", "[actors][node]") {
  ::setenv("RANK", "3", 1);
  ::setenv("WORLD_SIZE", "8", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  ::setenv("TROUPE_JOB_TOKEN", "secret", 1);
  auto o = troupe::node_options::from_env();
  CHECK(o.rank == 3);
  CHECK(o.world_size == 8);
  CHECK(o.master_port == 29500);
  CHECK(o.job_token == "secret");
  CHECK(o.worker_name() == "worker3");
  ::setenv("RANK", "three", 1);
  CHECK_THROWS_AS(troupe::node_options::from_env(), troupe::error);
  for (const char* v : {"RANK", "WORLD_SIZE", "MASTER_PORT", "TROUPE_JOB_TOKEN"}) ::unsetenv(v);
}

TEST_CASE("nodes with a busy direct channel shut down at once", "[actors][node][rpc]") {
  // Two nodes of one process; calls between them keep an executor thread leading on the direct
  // sockets (Note [direct channel]), which shutdown must stop without waiting for a poll timeout.
  troupe::node n0(first_of_two());
  troupe::node n1(second_of_two(n0));
  n0.functions().add("inc", [](int x) { return x + 1; });
  REQUIRE(n1.rpc_port() != 0);
  for (int i = 0; i < 20; ++i) REQUIRE(troupe::rpc_sync<int>(n1, "worker0", "inc", i, 2s) == i + 1);
  for (auto* n : {&n1, &n0}) {
    const auto t0 = std::chrono::steady_clock::now();
    n->shutdown(troupe::shutdown_mode::immediate);
    const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    CHECK(ms < 150);  // a leader re-entering its 200 ms poll made this 0.2-12 s
  }
}

TEST_CASE("two nodes of one job leave gracefully together in well under a second each", "[actors][node][shutdown]") {
  // Leaving costs the barrier and the teardown's own work: no poll period (200 ms), watch tick
  // (250 ms) or connection timeout (1 s) is waited out. About 10-30 ms on a loaded 2-core machine.
  troupe::node n0(first_of_two());
  troupe::node n1(second_of_two(n0));
  n0.functions().add("inc", [](int x) { return x + 1; });
  n1.functions().add("inc", [](int x) { return x + 1; });
  for (int i = 0; i < 5; ++i) {  // both directions have live connections and served calls
    REQUIRE(troupe::rpc_sync<int>(n1, "worker0", "inc", i, 2s) == i + 1);
    REQUIRE(troupe::rpc_sync<int>(n0, "worker1", "inc", i, 2s) == i + 1);
  }
  auto leave = [](troupe::node& n) {
    const auto t0 = std::chrono::steady_clock::now();
    n.shutdown(troupe::shutdown_mode::graceful, 5s);
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  auto other = std::async(std::launch::async, [&] { return leave(n1); });
  const double ms0 = leave(n0);
  REQUIRE(other.wait_for(10s) == std::future_status::ready);
  const double ms1 = other.get();
  CHECK(ms0 < 500);
  CHECK(ms1 < 500);
  try {
    troupe::rpc_sync<int>(n0, "worker1", "inc", 1, 1s);
    FAIL("a call after a graceful shutdown succeeded");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::invalid_state);
  }
}
