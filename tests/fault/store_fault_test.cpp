// Fault plans on store traffic (Note [store faults] in actors/src/store_client.cpp):
// - a lost store request or answer ends the call with a timeout naming the operation, the key
//   and the store host;
// - duplicates and delays reach the store;
// - rules match by operation, key or kind;
// - partitions cut store messages like any others.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "troupe/actors/fault_plan.hpp"
#include "troupe/actors/node.hpp"

using namespace std::chrono_literals;
using troupe::errc;

namespace {

troupe::node_options solo() {
  troupe::node_options o;
  o.job_token = "t";
  o.default_timeout = 5s;
  return o;
}

std::shared_ptr<troupe::fault_injector> injector(const std::string& plan) {
  return std::make_shared<troupe::fault_injector>(troupe::fault_plan::parse(plan));
}

// A store request as the client's proxy shows it to the hook.
troupe::envelope store_request(const std::string& from, const std::string& to, const std::string& op, const std::string& key) {
  return troupe::envelope{troupe::message_kind::store_request, from, to, 0, op, std::vector<char>(key.begin(), key.end()), {}};
}

// The error a call throws (timeout with "(no error)" when it throws none).
template <class F>
troupe::error failure_of(F&& fn) {
  try {
    fn();
  } catch (const troupe::error& e) {
    return e;
  }
  return troupe::error(errc::invalid_state, "(no error)");
}

}  // namespace

TEST_CASE("a store get the plan drops ends in a timeout naming the operation, the key and the store host", "[fault][store]") {
  auto inj = injector("rule troupe.store:k nth=2\n");  // the set passes, the first get is lost
  troupe::node n(solo(), {}, inj);
  n.store().set("k", "v");
  const auto start = std::chrono::steady_clock::now();
  const auto e = failure_of([&] { n.store().get("k", 200ms); });
  INFO(e.message());
  CHECK(e.code() == errc::timeout);
  CHECK_THAT(e.message(), Catch::Contains("store get 'k'") && Catch::Contains("no answer from the store host (rank 0"));
  CHECK(std::chrono::steady_clock::now() - start < 5s);  // the deadline: 200 ms plus the grace
  CHECK(n.store().get("k", 2s) == "v");                  // only the second request was lost
  CHECK(inj->counters().dropped_requests == 1);
  n.shutdown(troupe::shutdown_mode::immediate);
}

TEST_CASE("a lost store answer ends the call at its deadline, after the store ran it", "[fault][store]") {
  auto inj = injector("rule troupe.store.wait drop_reply=1\n");
  troupe::node n(solo(), {}, inj);
  n.store().set("w", "1");
  const auto e = failure_of([&] { n.store().wait({"w"}, 200ms); });
  INFO(e.message());
  CHECK(e.code() == errc::timeout);
  CHECK_THAT(e.message(), Catch::Contains("store wait") && Catch::Contains("no answer from the store host"));
  CHECK(inj->counters().dropped_replies == 1);
  n.shutdown(troupe::shutdown_mode::immediate);
}

TEST_CASE("a duplicated store add runs twice and a delayed set arrives late", "[fault][store]") {
  auto inj = injector("rule troupe.store:ctr duplicate=1\nrule troupe.store:late delay=300\n");
  troupe::node n(solo(), {}, inj);
  const auto first = n.store().add("ctr", 1);  // the first answer: after one or both adds
  CHECK((first == 1 || first == 2));
  CHECK(n.store().add("ctr", 0) == 2);
  const auto start = std::chrono::steady_clock::now();
  n.store().set("late", "x");
  CHECK(std::chrono::steady_clock::now() - start >= 300ms);
  CHECK(n.store().get("late", 2s) == "x");
  CHECK(inj->counters().duplicated >= 2);
  n.shutdown(troupe::shutdown_mode::immediate);
}

TEST_CASE("store rules match by operation, key and kind, not by the RPC kinds, and partitions cut store messages", "[fault][store]") {
  troupe::fault_injector by_key(troupe::fault_plan::parse("rule rpc_request drop=1\nrule troupe.store:a drop=1\n"));
  auto a = store_request("worker1", "worker0", "troupe.store.get", "a");
  auto b = store_request("worker1", "worker0", "troupe.store.get", "b");
  CHECK(by_key.on_send(a).copies == 0);
  CHECK(by_key.on_send(b).copies == 1);  // neither the rpc_request rule nor another key's rule
  troupe::fault_injector by_kind(troupe::fault_plan::parse("rule troupe.store drop=1\n"));
  auto c = store_request("worker1", "worker0", "troupe.store.set", "c");
  CHECK(by_kind.on_send(c).copies == 0);
  troupe::fault_injector by_op(troupe::fault_plan::parse("rule troupe.store.set drop=1\n"));
  auto d = store_request("worker1", "worker0", "troupe.store.get", "d");
  auto e = store_request("worker1", "worker0", "troupe.store.set", "e");
  CHECK(by_op.on_send(d).copies == 1);
  CHECK(by_op.on_send(e).copies == 0);
  troupe::fault_injector cut(troupe::fault_plan::parse("partition worker0 worker1\n"));
  auto f = store_request("worker1", "worker0", "troupe.store.get", "f");
  CHECK(cut.on_send(f).copies == 0);
  CHECK(cut.counters().partitioned == 1);
}
