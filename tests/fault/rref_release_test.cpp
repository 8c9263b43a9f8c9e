// Batched releases and the withheld remote_call answer (Note [release batching] in
// actors/src/rref/courier.cpp, Note [withheld accept] in actors/src/rref/serve.cpp).
#include <catch2/catch.hpp>

#include "fault/rref_cluster.hpp"

using namespace std::chrono_literals;
using troupe::rref;

TEST_CASE("forks released together on one node reach their owner as one batched delete", "[rref][fault]") {
  troupe::rref_options ro;
  ro.release_window = 2s;  // far longer than releasing 50 handles takes, even on a loaded machine
  troupe::test::cluster c(2, ro);
  troupe::add_function(c[1], "id", [](int x) { return x; });
  std::vector<rref<int>> live;
  for (int i = 0; i < 50; ++i) live.push_back(troupe::remote<int>(c[0], "worker1", "id", i));
  for (int i = 0; i < 50; ++i) REQUIRE(live[static_cast<std::size_t>(i)].to_here(5s) == i);
  const auto before = c[0].stats().user_deletes;
  live.clear();
  // The owner still holds them all until the window ends; then one message deletes every one.
  REQUIRE(c.quiescent(20s));
  CHECK(c[1].owner_count() == 0);
  CHECK(c[0].stats().user_deletes - before == 1);
}

TEST_CASE("a remote() never fetched is still confirmed and deleted once released", "[rref][fault]") {
  troupe::test::cluster c(2);  // default window: the withheld answers go when it ends
  troupe::add_function(c[1], "seven", [] { return 7; });
  {
    auto r = troupe::remote<int>(c[0], "worker1", "seven");
    // No to_here: the owner withholds the answer until the courier's window ends, and the
    // creator fork can only be deleted once confirmed.
  }
  REQUIRE(c.quiescent(10s));
  CHECK(c[1].owner_count() == 0);
  CHECK(c[0].user_count() == 0);
}

TEST_CASE("with no release window every release and answer goes at once", "[rref][fault]") {
  troupe::rref_options ro;
  ro.release_window = 0us;
  troupe::test::cluster c(2, ro);
  troupe::add_function(c[1], "id", [](int x) { return x; });
  const auto before = c[0].stats().user_deletes;
  for (int i = 0; i < 5; ++i) CHECK(troupe::remote<int>(c[0], "worker1", "id", i).to_here(5s) == i);
  REQUIRE(c.quiescent(10s));
  CHECK(c[0].stats().user_deletes - before == 5);
  CHECK(c[1].owner_count() == 0);
}

TEST_CASE("a release batch is an actor message to the owner's service that the fault plan matches by its type", "[rref][fault]") {
  troupe::rref_options ro;
  ro.release_window = 2s;
  troupe::test::cluster c(2, ro);
  troupe::add_function(c[1], "id", [](int x) { return x; });
  auto inj = std::make_shared<troupe::fault_injector>(
      troupe::fault_plan::parse("seed 1\nrule actor:troupe.rref.user_delete_batch fail_first=2\n"));
  c.hook->use(inj);
  std::vector<rref<int>> live;
  for (int i = 0; i < 5; ++i) live.push_back(troupe::remote<int>(c[0], "worker1", "id", i));
  for (int i = 0; i < 5; ++i) REQUIRE(live[static_cast<std::size_t>(i)].to_here(5s) == i);
  const auto before = c[0].stats().user_deletes;
  live.clear();
  // The first two attempts are dropped; the third (after two request timeouts) deletes all five.
  REQUIRE(c.quiescent(20s));
  CHECK(c[1].owner_count() == 0);
  CHECK(c[0].stats().user_deletes - before == 1);
  CHECK(inj->counters().dropped_requests == 2);
}
