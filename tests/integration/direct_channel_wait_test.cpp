// Multi-process tests of the caller side of the direct channel (Note [direct channel], "the caller
// reads its own response"):
// - a waiting caller reads its response on its own thread;
// - calls nobody waits on still complete: continuations, a late waiter, a waiter that gave up;
// - several threads waiting on one connection all get their answers.
#include <atomic>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/actors/transport.hpp"

using namespace std::chrono_literals;

namespace {

// Records the threads on which responses arrive at this node.
class response_threads final : public troupe::transport_hook {
 public:
  troupe::transport_decision on_receive(troupe::envelope& m) override {
    if (m.kind == troupe::message_kind::rpc_response) {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.insert(std::this_thread::get_id());
    }
    return {};
  }
  std::set<std::thread::id> seen() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    seen_.clear();
  }

 private:
  std::mutex mu_;
  std::set<std::thread::id> seen_;
};

void serve(std::uint16_t port) {
  troupe::node n(troupe::test::test_options(1, 2, port));
  n.functions().add("add", [](int a, int b) { return a + b; });
  n.functions().add("slow_add", [](int a, int b) {
    std::this_thread::sleep_for(50ms);  // the scenario: a call still running when the caller waits
    return a + b;
  });
  troupe::test::serve_until_done(n);
}

}  // namespace

TEST_CASE("a caller that waits reads its own response; calls nobody waits on still complete", "[actors][rpc]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { serve(pipe.read()); });
  auto hook = std::make_shared<response_threads>();
  troupe::node n(troupe::test::test_options(0, 2, 0), {}, hook);
  pipe.publish(n.port(), 1);
  n.store().wait({"ready"}, 10s);
  CHECK(troupe::rpc_sync<int>(n, "worker1", "add", 1, 2) == 3);  // connects
  hook->clear();
  for (int i = 0; i < 20; ++i) CHECK(troupe::rpc_sync<int>(n, "worker1", "slow_add", i, 1) == i + 1);
  CHECK(hook->seen() == std::set<std::thread::id>{std::this_thread::get_id()});  // never the I/O thread

  // A continuation: nobody waits, the I/O thread reads the response.
  std::promise<int> got;
  troupe::rpc_async<int>(n, "worker1", "slow_add", 20, 2).then([&got](troupe::rpc::future<int> f) { got.set_value(f.get()); });
  auto done = got.get_future();
  REQUIRE(done.wait_for(5s) == std::future_status::ready);
  CHECK(done.get() == 22);

  // A caller that only polls is_ready() sees the answer long before the deadline (a poll hands the
  // call to the I/O thread).
  auto polled = troupe::rpc_async<int>(n, "worker1", "slow_add", 1, 1, 30s);
  const auto t0 = std::chrono::steady_clock::now();
  while (!polled.is_ready() && std::chrono::steady_clock::now() - t0 < 10s) std::this_thread::sleep_for(1ms);  // the poll under test
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK(polled.get() == 2);

  // Note [blocking first read]: a caller waiting in its first recv still sees its deadline pass
  // promptly. The I/O thread's sweep completes the call; the wait notices within its 1 ms slice.
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      troupe::rpc_sync<int>(n, "worker1", "slow_add", i, 1, 10ms);
      FAIL("a 50 ms call with a 10 ms deadline answered");
    } catch (const troupe::error& e) {
      CHECK(e.code() == troupe::errc::timeout);
    }
    const auto waited = std::chrono::steady_clock::now() - t0;
    CHECK(waited >= 10ms);
    CHECK(waited < 150ms);  // 10 ms and a slice; the bound is for a loaded CI machine
  }

  // A waiter that comes after the deadline passed still gets the answer that came in time.
  auto late = troupe::rpc_async<int>(n, "worker1", "add", 3, 4, 300ms);
  std::this_thread::sleep_for(500ms);  // the scenario: the caller is busy past the deadline
  CHECK(late.get() == 7);

  // A waiter that gives up hands the reading over: the call completes without it.
  auto left = troupe::rpc_async<int>(n, "worker1", "slow_add", 5, 5);
  CHECK_FALSE(left.wait(1ms));
  std::promise<int> later;
  left.then([&later](troupe::rpc::future<int> f) { later.set_value(f.get()); });
  auto later_done = later.get_future();
  REQUIRE(later_done.wait_for(5s) == std::future_status::ready);
  CHECK(later_done.get() == 10);

  // Several threads waiting on one connection: one reads, the others get theirs too.
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int i = 0; i < 50; ++i)
        if (troupe::rpc_sync<int>(n, "worker1", (i % 5 == 0) ? "slow_add" : "add", k, i) == k + i) ++good;
    });
  for (auto& t : threads) t.join();
  CHECK(good == 200);
  troupe::test::release_children(n);
  CHECK(children.join(20s));
}
