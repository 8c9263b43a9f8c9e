// A SIGKILLed owner while a user -> user fork is in flight, and after it. In flight means its
// fork_request is held back and the parent holds its reference for G2. The child's to_here and
// method calls fail with owner_lost naming the owner. The parent's hold is released. The
// survivors shut down cleanly.
#include <signal.h>

#include <future>
#include <thread>

#include <catch2/catch.hpp>

#include "fault/rref_cluster.hpp"
#include "integration/rref_owner_child.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;
using troupe::errc;
using troupe::rref;

using troupe::test::code_of;
using troupe::test::tally;

namespace {

/// The rrefs worker2 received (its "keep" function stores them).
struct kept {
  std::mutex m;
  std::vector<rref<std::size_t>> never;
  std::vector<rref<tally>> tallies;
  std::vector<rref<int>> sevens;
};

}  // namespace

TEST_CASE("a SIGKILLed owner fails a forked rref's to_here and methods with owner_lost and releases the parent's hold",
          "[rref][integration]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { troupe::test::rref_owner_child(pipe, 3); });
  // worker0 (the parent) and worker2 (the child) live in this process; worker2's fork_requests
  // are dropped while the plan is on, so its forks stay unconfirmed: in flight.
  auto hook = std::make_shared<troupe::test::switch_hook>();
  troupe::node n0(troupe::test::test_options(0, 3, 0), {}, hook);
  pipe.publish(n0.port(), 1);
  troupe::node n2(troupe::test::test_options(2, 3, n0.port()), {}, hook);
  {
    troupe::rref_context c0(n0), c2(n2);
    kept k;
    troupe::add_function(c2, "keep", [&k](rref<std::size_t> never, rref<tally> t) {
      std::lock_guard<std::mutex> lock(k.m);
      k.never.push_back(std::move(never));
      k.tallies.push_back(std::move(t));
      return 1;
    });
    troupe::add_function(c2, "keep7", [&k](rref<int> r) {
      std::lock_guard<std::mutex> lock(k.m);
      k.sevens.push_back(std::move(r));
      return 1;
    });
    n0.store().wait({"ready/1"}, 10s);
    auto seven = troupe::remote<int>(c0, "worker1", "seven");
    auto never = troupe::remote<std::size_t>(c0, "worker1", "never");
    auto t = troupe::remote<tally>(c0, "worker1", "tally");
    REQUIRE(seven.to_here(5s) == 7);
    REQUIRE(t.rpc_sync<std::int64_t>("inc", std::int64_t{2}) == 2);

    hook->use(std::make_shared<troupe::fault_injector>(troupe::fault_plan::parse("seed 1\nrule actor:troupe.rref.fork_request drop=1\n")));
    REQUIRE(troupe::rpc_sync<int>(c0, "worker2", "keep", never, t) == 1);
    const auto never_id = never.id().str();
    never = {};
    t = {};
    // G2: worker0's fork of `never` has no handle left but still holds for its unconfirmed child.
    // (A released handle reaches its fork when the release window ends: Note [release batching].)
    const auto never_line = [&] {
      for (const auto& line : c0.leaks())
        if (line.find("user " + never_id + " ") != std::string::npos) return line;
      return std::string("no fork of " + never_id);
    };
    const auto until = std::chrono::steady_clock::now() + 2s;
    while (never_line().find("holds 1") == std::string::npos && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(1ms);
    CHECK(c0.user_count() == 3);
    CHECK_THAT(never_line(), Catch::Contains("holds 1"));
    CHECK_FALSE(k.never[0].confirmed_by_owner());
    std::string message;
    auto parked = std::async(std::launch::async, [&] { return code_of([&] { k.never[0].to_here(10s); }, &message); });
    if (parked.wait_for(300ms) != std::future_status::timeout) FAIL("to_here ended early: " << static_cast<int>(parked.get()) << " " << message);

    const auto t0 = std::chrono::steady_clock::now();
    children.kill(0, SIGKILL);
    REQUIRE(parked.wait_for(5s) == std::future_status::ready);
    CHECK(parked.get() == errc::owner_lost);
    const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    WARN("SIGKILL of the owner -> the forked rref's parked to_here fails: " << ms << " ms");
    CHECK(ms < 2000);
    CHECK_THAT(message, Catch::Contains("worker1"));
    CHECK(code_of([&] { k.tallies[0].rpc_sync<std::int64_t>("inc", std::int64_t{1}); }, &message) == errc::owner_lost);
    CHECK_THAT(message, Catch::Contains("worker1"));
    hook->use(nullptr);
    // A fork made after the owner died (worker0 -> worker2), its parent handle released at once.
    REQUIRE(troupe::rpc_sync<int>(c0, "worker2", "keep7", seven) == 1);
    seven = {};
    // The in-flight fork_requests end with peer_lost and the late fork's too: each child acks
    // its parent, so worker0's holds go and its forks end (their deletes fail with peer_lost).
    if (!c0.wait_quiescent(10s, true)) {
      std::string leaks;
      for (auto* c : {&c0, &c2})
        for (const auto& l : c->leaks()) leaks += c->name() + ": " + l + "\n";
      FAIL_CHECK("the parent still holds its forks:\n" << leaks << "in flight " << c0.in_flight() << " / " << c2.in_flight());
    }
    CHECK(code_of([&] { k.sevens[0].to_here(3s); }, &message) == errc::owner_lost);
    CHECK_THAT(message, Catch::Contains("worker1"));
    CHECK(code_of([&] { k.tallies[0].rpc_async<std::int64_t>("inc", std::int64_t{1}).get(); }, &message) == errc::owner_lost);
    {
      std::lock_guard<std::mutex> lock(k.m);
      k.never.clear();
      k.tallies.clear();
      k.sevens.clear();
    }
    // The survivors shut down cleanly, bounded.
    const auto s0 = std::chrono::steady_clock::now();
    CHECK_NOTHROW(c2.shutdown(10s));
    CHECK_NOTHROW(c0.shutdown(10s));
    const auto shut_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - s0).count();
    WARN("survivors' rref shutdown: " << shut_ms << " ms");
  }
  CHECK_THROWS_AS(children.join(10s), troupe::error);  // rank 1 died by SIGKILL
}
