// Graceful end of an rref_context: it waits for every RRef to be released and reports leaks by id.
#include <catch2/catch.hpp>

#include "fault/rref_cluster.hpp"

using namespace std::chrono_literals;
using troupe::errc;
using troupe::rref;

TEST_CASE("shutdown waits for released rrefs and reports the ones still alive by id", "[rref][fault]") {
  troupe::test::cluster c(2);
  troupe::add_function(c[1], "seven", [] { return 7; });
  troupe::add_function(c[1], "take", [](rref<int> r) { return r.owner_name().size(); });
  {
    auto r = troupe::remote<int>(c[0], "worker1", "seven");
    CHECK(r.to_here(5s) == 7);
  }
  CHECK_NOTHROW(c[0].shutdown(5s));  // everything released: returns once the delete is through
  CHECK_NOTHROW(c[1].shutdown(5s));

  // A lost user call that carried an rref. The sender probes the callee, which never got it, and
  // drops its hold, so nothing leaks. A late copy of that call would be refused.
  c.hook->use(std::make_shared<troupe::fault_injector>(troupe::fault_plan::parse("rule take drop=1\nrule mint drop_reply=1\n")));
  {
    auto kept = troupe::make_rref(c[0], 5);
    CHECK_THROWS(troupe::rpc_sync<std::size_t>(c[0], "worker1", "take", kept, 100ms));
  }
  CHECK_NOTHROW(c[0].shutdown(5s));
  // A lost reply that carried an rref: the callee probes the caller after result_probe_after
  // (1.5 s in these tests) and drops its hold.
  troupe::add_function(c[1], "mint", [&c](int v) { return troupe::make_rref(c[1], v); });
  CHECK_THROWS(troupe::rpc_sync<rref<int>>(c[0], "worker1", "mint", 3, 100ms));
  CHECK(c[1].owner_count() == 1);
  CHECK_NOTHROW(c[1].shutdown(5s));
  c.hook->use(nullptr);
  // Something still held is reported by id.
  auto held = troupe::make_rref(c[0], 9);
  try {
    c[0].shutdown(100ms);
    FAIL("shutdown must report the live rref");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::timeout);
    CHECK_THAT(e.message(), Catch::Contains("owner " + held.id().str()) && Catch::Contains("local refs 1"));
  }
}

TEST_CASE("an rref inside the value of another rref is refused as not supported", "[rref]") {
  troupe::test::cluster c(2);
  troupe::add_function(c[1], "wrap", [&c](int v) { return troupe::make_rref(c[1], v); });
  auto r = troupe::remote<rref<int>>(c[0], "worker1", "wrap", 4);
  try {
    r.to_here(5s);
    FAIL("must be refused");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::remote_exception);
    CHECK_THAT(e.message(), Catch::Contains("not_supported") && Catch::Contains("inside the value of another rref"));
  }
  r = rref<rref<int>>();
  CHECK(c.quiescent(5s));
}
