// Replies written together (Note [reply batch] in troupe/actors/rpc/reply_batch.hpp): answers
// given into a batch stay on the callee until the batch ends, then all arrive; other answers
// leave at once.
#include <map>
#include <mutex>
#include <thread>

#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/rpc/reply_batch.hpp"

using namespace std::chrono_literals;

namespace {

// Two nodes in this process (real loopback TCP between them); worker1 parks "park" calls.
struct parking_pair {
  std::unique_ptr<troupe::node> n0, n1;
  std::mutex mutex;
  std::map<int, std::shared_ptr<troupe::rpc::reply_later>> parked;  // by the call's argument

  parking_pair() {
    n0 = std::make_unique<troupe::node>(troupe::test::test_options(0, 2, 0, "batch-test"));
    n1 = std::make_unique<troupe::node>(troupe::test::test_options(1, 2, n0->port(), "batch-test"));
    n1->functions().add("park", [this](troupe::rpc::served_call& call, int key) {
      std::lock_guard<std::mutex> lock(mutex);
      parked[key] = call.defer();
      return troupe::rpc::deferred{};
    });
  }
  ~parking_pair() {
    n1->shutdown(troupe::shutdown_mode::immediate);
    n0->shutdown(troupe::shutdown_mode::immediate);
  }
  // Waits (bounded) until `n` calls are parked.
  bool parked_count(std::size_t n) {
    const auto until = std::chrono::steady_clock::now() + 5s;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (parked.size() >= n) return true;
      }
      if (std::chrono::steady_clock::now() > until) return false;
      std::this_thread::sleep_for(1ms);
    }
  }
};

}  // namespace

TEST_CASE("answers given into a reply batch leave only when it ends", "[rpc][batch]") {
  parking_pair p;
  auto first = troupe::rpc_async<int>(*p.n0, "worker1", "park", 1);
  auto second = troupe::rpc_async<int>(*p.n0, "worker1", "park", 2);
  auto third = troupe::rpc_async<int>(*p.n0, "worker1", "park", 3);
  REQUIRE(p.parked_count(3));
  {
    troupe::rpc::reply_batch together;
    p.parked[1]->complete(10, together);
    p.parked[2]->fail(troupe::errc::remote_exception, "second refused", &together);
    CHECK_FALSE(first.wait(200ms));
    CHECK_FALSE(second.is_ready());
    p.parked[3]->complete(30, together);
    CHECK_FALSE(third.wait(50ms));
  }
  REQUIRE(first.wait(5s));
  CHECK(first.get() == 10);
  REQUIRE(second.wait(5s));
  CHECK_THROWS_WITH(second.get(), Catch::Contains("second refused"));
  REQUIRE(third.wait(5s));
  CHECK(third.get() == 30);
}

TEST_CASE("an answer given outside a reply batch goes at once", "[rpc][batch]") {
  parking_pair p;
  auto call = troupe::rpc_async<int>(*p.n0, "worker1", "park", 1);
  REQUIRE(p.parked_count(1));
  p.parked[1]->complete(7);
  REQUIRE(call.wait(5s));
  CHECK(call.get() == 7);
}

TEST_CASE("an answer not given into the reply batch open on its thread leaves at once", "[rpc][batch]") {
  parking_pair p;
  auto first = troupe::rpc_async<int>(*p.n0, "worker1", "park", 1);
  auto second = troupe::rpc_async<int>(*p.n0, "worker1", "park", 2);
  REQUIRE(p.parked_count(2));
  {
    troupe::rpc::reply_batch together;
    p.parked[1]->complete(10, together);
    p.parked[2]->complete(20);  // same connection, written after the held one
    REQUIRE(second.wait(5s));
    CHECK(second.get() == 20);
    CHECK_FALSE(first.is_ready());  // held: the connection delivers in order, so it was not sent
  }
  REQUIRE(first.wait(5s));
  CHECK(first.get() == 10);
}
