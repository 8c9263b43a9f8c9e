// Multi-process tests of the rendezvous store (Note [store]).
#include <csignal>
#include <future>

#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;
using troupe::errc;

TEST_CASE("store operations are shared by every rank", "[actors][store]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(2, [&](int i) {
    const int rank = i + 1;
    troupe::node n(troupe::test::test_options(rank, 3, pipe.read()));
    auto& s = n.store();
    s.set("key/" + std::to_string(rank), "value" + std::to_string(rank));
    s.add("counter", 10);
    // Each rank waits for the other's key: a real rendezvous.
    const std::string other = "key/" + std::to_string(rank == 1 ? 2 : 1);
    s.wait({other}, 10s);
    if (s.get(other, 1s) != "value" + std::to_string(rank == 1 ? 2 : 1)) throw std::runtime_error("wrong value of " + other);
    s.barrier("phase1", rank, 3, 10s);
    n.shutdown(troupe::shutdown_mode::graceful, 10s);
  });
  troupe::node n(troupe::test::test_options(0, 3, 0));
  pipe.publish(n.port(), 2);
  auto& s = n.store();
  s.barrier("phase1", 0, 3, 10s);
  CHECK(s.add("counter", 1) == 21);
  CHECK(s.get("key/1", 1s) == "value1");
  CHECK(s.compare_set("cas", "", "first") == "first");
  CHECK(s.compare_set("cas", "wrong", "second") == "first");
  CHECK(s.compare_set("cas", "first", "second") == "second");
  const auto before = s.num_keys();
  CHECK(s.erase("cas"));
  CHECK_FALSE(s.erase("cas"));
  CHECK(s.num_keys() == before - 1);
  s.set("text", "abc");
  CHECK_THROWS_MATCHES(s.add("text", 1), troupe::error, Catch::Predicate<troupe::error>([](const troupe::error& e) {
                         return e.code() == errc::bad_argument;
                       }));
  try {
    s.get("never", 100ms);
    FAIL("get of a missing key returned");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::timeout);
    CHECK_THAT(e.message(), Catch::Contains("never"));
  }
  n.shutdown(troupe::shutdown_mode::graceful, 10s);
  CHECK(children.join(10s));
}

TEST_CASE("a store barrier that times out names the ranks that did not arrive", "[actors][store]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int i) {
    troupe::node n(troupe::test::test_options(i + 1, 4, pipe.read()));
    try {
      n.store().barrier("partial", i + 1, 4, 300ms);
    } catch (const troupe::error& e) {
      if (e.code() != errc::timeout) throw;
      n.store().set("child_saw", e.message());
      n.store().get("done", 10s);
      return;
    }
    throw std::runtime_error("barrier with missing ranks succeeded");
  });
  troupe::node n(troupe::test::test_options(0, 4, 0));
  pipe.publish(n.port(), 1);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    n.store().barrier("partial", 0, 4, 300ms);
    FAIL("barrier with missing ranks succeeded");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::timeout);
    CHECK_THAT(e.message(), Catch::Contains("did not arrive: 2, 3"));
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 3s);
  CHECK_THAT(n.store().get("child_saw", 5s), Catch::Contains("did not arrive: 2, 3"));
  n.store().set("done", "1");
  CHECK(children.join(10s));
}

TEST_CASE("graceful shutdown with a missing rank times out naming it", "[actors][store][shutdown]") {
  troupe::node n(troupe::test::test_options(0, 2, 0));
  try {
    n.shutdown(troupe::shutdown_mode::graceful, 200ms);
    FAIL("graceful shutdown without rank 1 succeeded");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::timeout);
    CHECK_THAT(e.message(), Catch::Contains("did not arrive: 1"));
  }
  CHECK_THROWS_AS(n.store(), troupe::error);  // torn down anyway
}

TEST_CASE("store calls pending when the store host is killed fail with peer_lost naming it", "[actors][store]") {
  troupe::test::port_pipe pipe;  // used backwards: the child (rank 0) publishes, the parent reads
  auto children = troupe::spawn(1, [&](int) {
    troupe::node n(troupe::test::test_options(0, 2, 0));
    pipe.publish(n.port(), 1);
    n.store().get("never", 30s);  // parked until the parent kills us
  });
  troupe::node n(troupe::test::test_options(1, 2, pipe.read()));
  n.store().set("ready", "1");  // the store answers: the connection is up
  auto pending = std::async(std::launch::async, [&] {
    try {
      n.store().get("never", 20s);
    } catch (const troupe::error& e) {
      return e;
    }
    return troupe::error(troupe::errc::invalid_state, "get of a missing key returned");
  });
  const auto killed = std::chrono::steady_clock::now();
  children.kill(0, SIGKILL);
  REQUIRE(pending.wait_for(5s) == std::future_status::ready);
  const auto waited = std::chrono::steady_clock::now() - killed;
  const auto e = pending.get();
  CHECK(e.code() == errc::peer_lost);
  CHECK_THAT(e.message(), Catch::Contains("store host") && Catch::Contains("never"));
  CHECK(waited < 1500ms);
  // Later calls fail at once the same way.
  CHECK_THROWS_MATCHES(n.store().set("after", "1"), troupe::error, Catch::Predicate<troupe::error>([](const troupe::error& x) {
                         return x.code() == errc::peer_lost;
                       }));
  CHECK_THROWS_AS(children.join(5s), troupe::error);  // the child died of SIGKILL
}
