// The four sharing scenarios of the RRef protocol, owner-local RRefs, nested forks, method calls
// and errors, each under every fault type of the fault plan (Note [RRef protocol]).
#include <future>
#include <map>

#include <catch2/catch.hpp>

#include "fault/rref_cluster.hpp"

using namespace std::chrono_literals;
using troupe::errc;
using troupe::rref;

namespace {

// Faults on the retried control messages, which are actor messages to the peers' RRef services:
// drop, fail first N, lost answers ("actor:troupe.rref.answer"). Faults on everything too:
// duplicate, delay and reorder are harmless to user calls that carry no RRef twice.
const char* const plans[] = {
    "seed 1\n",
    "seed 2\nrule actor:troupe.rref.fork_request fail_first=2\nrule actor:troupe.rref.child_ack fail_first=2\n"
    "rule actor:troupe.rref.user_delete_batch fail_first=2\n",
    "seed 3\nrule actor:troupe.rref.fork_request drop=0.4\nrule actor:troupe.rref.child_ack drop=0.4\n"
    "rule actor:troupe.rref.user_delete_batch drop=0.4\nrule actor:troupe.rref.answer drop=0.4\n",
    "seed 4\nrule actor:troupe.rref.fork_request duplicate=0.6\nrule actor:troupe.rref.child_ack duplicate=0.6\n"
    "rule actor:troupe.rref.user_delete_batch duplicate=0.6\nrule troupe.rref.remote_call duplicate=0.6\nrule troupe.rref.fetch duplicate=0.6\n",
    "seed 5\nrule * delay=1..8\n",
    "seed 6\nrule * reorder=15\n",
};

// The functions every worker serves; `kept` is the RRef store of each worker.
struct fixture {
  troupe::test::cluster c{4};
  std::mutex mutex;
  std::map<std::string, rref<int>> kept;

  fixture() {
    for (int i = 0; i < 4; ++i) {
      auto& ctx = c[i];
      const std::string me = troupe::test::cluster::name(i);
      troupe::add_function(ctx, "seven", [] { return 7; });
      troupe::add_function(ctx, "square", [](int x) { return x * x; });
      troupe::add_function(ctx, "boom", [](int) -> int { throw std::runtime_error("boom from the user function"); });
      troupe::add_function(ctx, "mint", [&ctx](int v) { return troupe::make_rref(ctx, v); });
      troupe::add_function(ctx, "fetch", [](rref<int> r) { return r.to_here(3s); });
      troupe::add_function(ctx, "owned_value", [](rref<int> r) { return r.is_owner() ? r.local_value() : -1; });
      troupe::add_function(ctx, "keep", [this, me](std::string key, rref<int> r) {
        std::lock_guard<std::mutex> lock(mutex);
        kept[me + "/" + key] = std::move(r);
        return 0;
      });
      troupe::add_function(ctx, "give", [this, me](std::string key) {
        std::lock_guard<std::mutex> lock(mutex);
        auto r = std::move(kept.at(me + "/" + key));
        kept.erase(me + "/" + key);
        return r;
      });
      // Passes the RRef one hop further (nested forks), the last hop fetches it.
      troupe::add_function(ctx, "relay", [&ctx](rref<int> r, std::vector<std::string> path) {
        if (path.empty()) return r.to_here(3s);
        const std::string next = path.front();
        path.erase(path.begin());
        return troupe::rpc_sync<int>(ctx, next, "relay", r, path);
      });
    }
  }

  void expect_clean() {
    {
      std::lock_guard<std::mutex> lock(mutex);
      kept.clear();
    }
    INFO(c.leaks());
    CHECK(c.quiescent(10s));
    for (int i = 0; i < 4; ++i) CHECK(c[i].owner_count() == 0);
  }
};

}  // namespace

TEST_CASE("the four sharing scenarios and nested forks work under every fault type", "[rref][fault]") {
  fixture f;
  for (const char* text : plans) {
    auto plan = troupe::fault_plan::parse(text);
    INFO("fault plan:\n" << plan.to_string());
    f.c.hook->use(std::make_shared<troupe::fault_injector>(plan));
    {
      // user -> owner as argument: worker0 holds an rref owned by worker1 and passes it back.
      auto r = troupe::remote<int>(f.c[0], "worker1", "square", 6);
      CHECK(r.to_here(5s) == 36);
      CHECK(troupe::rpc_sync<int>(f.c[0], "worker1", "owned_value", r) == 36);
      // user -> user: worker0 passes it to worker2, which fetches from worker1.
      CHECK(troupe::rpc_sync<int>(f.c[0], "worker2", "fetch", r) == 36);
      // user -> owner as return value: worker2 keeps it, then returns it to its owner.
      CHECK(troupe::rpc_sync<int>(f.c[0], "worker2", "keep", std::string("a"), r) == 0);
      auto back = troupe::rpc_sync<rref<int>>(f.c[1], "worker2", "give", std::string("a"));
      CHECK(back.is_owner());
      CHECK(back.local_value() == 36);
      // owner -> user: worker3 mints an rref it owns and returns it; worker0 uses it.
      auto minted = troupe::rpc_sync<rref<int>>(f.c[0], "worker3", "mint", 11);
      CHECK_FALSE(minted.is_owner());
      CHECK(minted.owner_name() == "worker3");
      CHECK(minted.to_here(5s) == 11);
      // rrefs as arguments of remote and through rpc_async.
      CHECK(troupe::remote<int>(f.c[2], "worker1", "fetch", minted).to_here(5s) == 11);
      auto fut = troupe::rpc_async<rref<int>>(f.c[2], "worker3", "mint", 12);
      CHECK(troupe::get_bound(f.c[2], fut).to_here(5s) == 12);
      // nested forks: owner worker3 -> worker0 -> worker1 -> worker2 -> worker0 fetches.
      CHECK(troupe::rpc_sync<int>(f.c[0], "worker1", "relay", minted, std::vector<std::string>{"worker2", "worker0"}) == 11);
    }
    f.c.hook->use(nullptr);
    f.expect_clean();
  }
}

TEST_CASE("an owner-local rref gives its value locally and is deleted with its last reference", "[rref]") {
  troupe::test::cluster c(2);
  {
    auto r = troupe::make_rref(c[0], std::string("hello"));
    CHECK(r.is_owner());
    CHECK(r.confirmed_by_owner());
    CHECK(r.owner_name() == "worker0");
    CHECK(r.local_value() == "hello");
    CHECK(r.to_here(1s) == "hello");
    CHECK(c[0].owner_count() == 1);
  }
  // The release reaches the owner actor as a message: the deletion follows shortly after.
  CHECK(c[0].wait_quiescent(5s, true));
  CHECK(c[0].owner_count() == 0);
}

TEST_CASE("remote returns at once and the creator's rref is confirmed by the owner", "[rref]") {
  troupe::test::cluster c(2);
  troupe::add_function(c[1], "seven", [] { return 7; });
  auto r = troupe::remote<int>(c[0], "worker1", "seven");
  CHECK_FALSE(r.is_owner());
  CHECK(r.to_here(5s) == 7);
  CHECK(c[1].owner_count() == 1);
  // The reply to remote_call confirms the creator fork (it may still be on its way).
  CHECK(c[0].user_count() == 1);
  try {
    r.local_value();
    FAIL("local_value on a user must fail");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::invalid_state);
    CHECK_THAT(e.message(), Catch::Contains("only its owner worker1"));
  }
  r = rref<int>();
  CHECK(c.quiescent(5s));
  CHECK(c[1].owner_count() == 0);
}

TEST_CASE("a user function that throws makes to_here fail with its text", "[rref]") {
  troupe::test::cluster c(2);
  troupe::add_function(c[1], "boom", [](int) -> int { throw std::runtime_error("boom from the user function"); });
  auto r = troupe::remote<int>(c[0], "worker1", "boom", 1);
  try {
    r.to_here(5s);
    FAIL("to_here must fail");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::remote_exception);
    CHECK_THAT(e.message(), Catch::Contains("boom from the user function") && Catch::Contains("worker1"));
  }
  r = rref<int>();
  CHECK(c.quiescent(5s));
}

TEST_CASE("to_here times out cleanly while the value does not exist", "[rref]") {
  troupe::test::cluster c(2);
  std::promise<void> release;
  auto released = release.get_future().share();
  troupe::add_function(c[1], "slow", [released] {
    released.wait_for(5s);
    return 1;
  });
  auto r = troupe::remote<int>(c[0], "worker1", "slow");
  const auto t0 = std::chrono::steady_clock::now();
  try {
    r.to_here(200ms);
    FAIL("to_here must time out");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::timeout);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 1500ms);
  release.set_value();
  CHECK(r.to_here(5s) == 1);  // the value arrives later
  r = rref<int>();
  CHECK(c.quiescent(5s));
}

namespace {
struct counter_server {
  std::int64_t total = 0;
  template <class Ar> void serialize(Ar& ar, unsigned) { ar & total; }
};
}  // namespace

TEST_CASE("a registered method of T runs on the owner through the rref", "[rref]") {
  troupe::test::cluster c(2);
  for (int i = 0; i < 2; ++i)
    troupe::add_method<counter_server>(c[i], "add", [](counter_server& s, std::int64_t x) { return s.total += x; });
  troupe::add_function(c[1], "bump", [](rref<counter_server> ps, std::int64_t x) { return ps.rpc_sync<std::int64_t>("add", x); });
  {
    auto ps = troupe::make_rref(c[0], counter_server{});
    CHECK(troupe::rpc_sync<std::int64_t>(c[0], "worker1", "bump", ps, std::int64_t{5}) == 5);
    CHECK(troupe::rpc_sync<std::int64_t>(c[0], "worker1", "bump", ps, std::int64_t{7}) == 12);
    CHECK(ps.rpc_sync<std::int64_t>("add", std::int64_t{1}) == 13);  // the owner through its own rref
    CHECK(ps.local_value().total == 13);
    auto later = ps.remote<std::int64_t>("add", std::int64_t{2});  // remote() semantics: an rref to the result
    CHECK(later.to_here(5s) == 15);
    CHECK(later.owner_name() == "worker0");
  }
  CHECK(c.quiescent(5s));
  CHECK(c[0].owner_count() == 0);
}

TEST_CASE("a method call that overtakes the remote_call creating its value waits for the value", "[rref][fault]") {
  troupe::test::cluster c(2);
  for (int i = 0; i < 2; ++i) {
    troupe::add_function(c[i], "server", [] { return counter_server{}; });
    troupe::add_method<counter_server>(c[i], "add", [](counter_server& s, std::int64_t x) { return s.total += x; });
  }
  // Only the remote_call is held back: the method call sent right after it arrives first.
  c.hook->use(std::make_shared<troupe::fault_injector>(
      troupe::fault_plan::parse("seed 7\nrule troupe.rref.remote_call delay=300..300\n")));
  {
    auto ps = troupe::remote<counter_server>(c[0], "worker1", "server");
    CHECK(ps.rpc_sync<std::int64_t>("add", std::int64_t{4}) == 4);
    CHECK(ps.rpc_sync<std::int64_t>("add", std::int64_t{3}) == 7);
  }
  c.hook->use(nullptr);
  CHECK(c.quiescent(5s));
  CHECK(c[1].owner_count() == 0);
}
