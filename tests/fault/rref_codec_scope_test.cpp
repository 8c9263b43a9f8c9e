// RRefs in payloads follow the codec context of their encode or decode (Note [codec context]).
// A call's arguments collect their forks in that call's send_scope. A result binds to the
// context only under its binding_scope. A served call's answer knows its caller.
#include <mutex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "fault/rref_cluster.hpp"

using namespace std::chrono_literals;
using troupe::errc;
using troupe::rref;

namespace {

// The code of the troupe::error `fn` throws (ok: none).
template <class F>
errc code_of(F&& fn) {
  try {
    fn();
  } catch (const troupe::error& e) {
    return e.code();
  }
  return errc::ok;
}

// What worker1 keeps of the rrefs it received.
struct kept {
  std::mutex m;
  std::vector<rref<int>> refs;
};

}  // namespace

TEST_CASE("rrefs sent in two calls from one thread are probed only for the call that failed", "[rref][fault]") {
  troupe::test::cluster c(2);
  auto store = std::make_shared<kept>();
  troupe::add_function(c[1], "keep", [store](rref<int> r) {
    std::lock_guard<std::mutex> lock(store->m);
    store->refs.push_back(std::move(r));
    return static_cast<int>(store->refs.size());
  });
  {
    auto a = troupe::make_rref(c[0], 1);
    auto b = troupe::make_rref(c[0], 2);
    // Both calls are encoded on this thread before either is answered.
    auto ok = troupe::rpc_async<int>(c[0], "worker1", "keep", a, 5s);
    auto bad = troupe::rpc_async<int>(c[0], "worker1", "no_such_function", b, 5s);
    CHECK(ok.get() == 1);
    CHECK(code_of([&] { bad.get(); }) == errc::unknown_function);
    // The kept fork lives on worker1; the fork of the failed call was probed and its hold dropped.
    std::lock_guard<std::mutex> lock(store->m);
    REQUIRE(store->refs.size() == 1);
    CHECK(store->refs[0].to_here(5s) == 1);
  }
  {
    std::lock_guard<std::mutex> lock(store->m);
    store->refs.clear();
  }
  CHECK(c.quiescent(10s));
  CHECK(c.leaks().empty());
}

TEST_CASE("an rref in a result decoded without its context's binding scope stays unbound until bound", "[rref][fault]") {
  troupe::test::cluster c(2);
  troupe::add_function(c[1], "mint", [&c](int v) { return troupe::make_rref(c[1], v); });
  {
    auto plain = troupe::rpc_async<rref<int>>(c[0], "worker1", "mint", 5, 5s).get();  // get(): no binding scope
    CHECK(code_of([&] { (void)plain.to_here(1s); }) == errc::invalid_state);
    plain.bind_to(c[0].impl());
    CHECK(plain.to_here(5s) == 5);
    auto bound = troupe::rpc_sync<rref<int>>(c[0], "worker1", "mint", 6, 5s);  // get_bound: bound at once
    CHECK(bound.to_here(5s) == 6);
    CHECK(bound.owner() == "worker1");
  }
  CHECK(c.quiescent(10s));
  CHECK(c.leaks().empty());
}

TEST_CASE("an rref returned through a served function's nested call reaches the first caller", "[rref][fault]") {
  troupe::test::cluster c(3);
  troupe::add_function(c[2], "mint", [&c](int v) { return troupe::make_rref(c[2], v); });
  // worker1 serves worker0 and, on the same thread, calls worker2: each answer goes to its own caller.
  troupe::add_function(c[1], "relay", [&c](int v) { return troupe::rpc_sync<rref<int>>(c[1], "worker2", "mint", v, 5s); });
  {
    auto r = troupe::rpc_sync<rref<int>>(c[0], "worker1", "relay", 9, 5s);
    CHECK(r.owner() == "worker2");
    CHECK(r.to_here(5s) == 9);
  }
  CHECK(c.quiescent(10s));
  CHECK(c.leaks().empty());
}
