// The RRef protocol as actors (Note [RRef protocol]):
// - tombstones are freed after rref_options::tombstone_ttl;
// - parked to_here calls wait in the owner's router entry, not on its executor;
// - the timeout-last API;
// - rref<T> as an identity object with an explicit share().
#include <future>
#include <thread>

#include <catch2/catch.hpp>

#include "fault/rref_cluster.hpp"

using namespace std::chrono_literals;
using troupe::errc;
using troupe::rref;

namespace {

// Polls `pred` until it holds or `timeout` passed (a bounded wait on an observable condition).
template <class P>
bool eventually(P pred, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

}  // namespace

TEST_CASE("tombstones of deleted rrefs are freed after the tombstone ttl", "[rref][fault]") {
  troupe::rref_options ro;
  ro.tombstone_ttl = 300ms;
  troupe::test::cluster c(2, ro);
  troupe::add_function(c[1], "seven", [] { return 7; });
  {
    auto r = troupe::remote<int>(c[0], "worker1", "seven");
    CHECK(r.to_here(5s) == 7);
  }
  REQUIRE(c.quiescent(5s));
  // The owner remembers the deleted id, the user the released fork ...
  CHECK(c[1].tombstone_count() >= 1);
  CHECK(c[0].tombstone_count() >= 1);
  // ... and both forget them once the ttl (plus one sweep period, ttl / 2) has passed.
  CHECK(eventually([&] { return c[0].tombstone_count() == 0 && c[1].tombstone_count() == 0; }, 3s));
}

TEST_CASE("parked to_here calls wait in the owner's router entry and leave its executor free", "[rref][fault]") {
  troupe::test::cluster c(2);  // 6 executor threads per node
  std::promise<void> go;
  auto released = go.get_future().share();
  troupe::add_function(c[1], "slow", [released] {
    released.wait_for(10s);
    return 5;
  });
  troupe::add_function(c[1], "seven", [] { return 7; });
  auto r = troupe::remote<int>(c[0], "worker1", "slow");
  std::vector<std::future<int>> waiting;
  for (int i = 0; i < 12; ++i) {  // twice as many parked fetches as the owner has executor threads
    waiting.push_back(std::async(std::launch::async, [&c, share = r.share()] { return share.to_here(8s); }));
  }
  // A call to the owner is served at once: no executor thread waits for the value.
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(troupe::rpc_sync<int>(c[0], "worker1", "seven", 2s) == 7);
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
  go.set_value();
  for (auto& w : waiting) CHECK(w.get() == 5);
  r = rref<int>();
  CHECK(c.quiescent(5s));
}

TEST_CASE("remote takes its timeout as the last argument", "[rref]") {
  troupe::test::cluster c(2);
  troupe::add_function(c[1], "square", [](int x) { return x * x; });
  troupe::add_function(c[1], "pause", [](int ms) {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));  // the function under test is slow, not a synchronisation
    return ms;
  });
  CHECK(troupe::remote<int>(c[0], "worker1", "square", 6).to_here(5s) == 36);
  CHECK(troupe::remote<int>(c[0], "worker1", "square", 7, 2s).to_here(5s) == 49);
  CHECK(troupe::remote<int>(c[0], "worker1", "square", 8, troupe::rpc::deadline{2000ms}).to_here(5s) == 64);
  // The value takes longer than to_here waits: a clean timeout, the value still comes later.
  auto slow = troupe::remote<int>(c[0], "worker1", "pause", 400, 5s);
  try {
    slow.to_here(50ms);
    FAIL("to_here must time out");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::timeout);
    CHECK_THAT(e.message(), Catch::Contains(slow.id().str()));
  }
  CHECK(slow.to_here(5s) == 400);
  slow = rref<int>();
  CHECK(c.quiescent(5s));
}

TEST_CASE("an rref is an identity object and share makes a second handle on the same reference", "[rref]") {
  STATIC_REQUIRE(std::is_nothrow_move_constructible_v<rref<int>>);
  STATIC_REQUIRE_FALSE(std::is_copy_constructible_v<rref<int>>);
  STATIC_REQUIRE_FALSE(std::is_copy_assignable_v<rref<int>>);
  troupe::test::cluster c(2);
  troupe::add_function(c[1], "seven", [] { return 7; });
  auto a = troupe::remote<int>(c[0], "worker1", "seven");
  auto b = a.share();
  CHECK(b.id() == a.id());
  auto moved = std::move(a);
  CHECK_FALSE(a);  // NOLINT(bugprone-use-after-move): a moved-from rref is empty
  moved = rref<int>();
  CHECK(b.to_here(5s) == 7);  // the reference lives while one handle does
  CHECK(c[0].user_count() == 1);
  b = rref<int>();
  CHECK(c.quiescent(5s));
  CHECK(c[1].owner_count() == 0);
}
