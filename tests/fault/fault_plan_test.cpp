// The seeded fault plan: parsing, replay, and its effect on real calls through a node.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <catch2/catch.hpp>

#include "troupe/actors/fault_plan.hpp"
#include "troupe/actors/rpc/api.hpp"

using namespace std::chrono_literals;
using troupe::errc;

namespace {

troupe::envelope request(const std::string& fn, std::uint64_t id) {
  return troupe::envelope{troupe::message_kind::rpc_request, "worker0", "worker1", id, fn, {}, {}};
}

std::vector<troupe::transport_decision> decisions(const troupe::fault_plan& plan, int n) {
  troupe::fault_injector inj(plan);
  std::vector<troupe::transport_decision> out;
  for (int i = 0; i < n; ++i) {
    auto e = request("f", static_cast<std::uint64_t>(i));
    out.push_back(inj.on_send(e));
  }
  return out;
}

troupe::node_options solo() {
  troupe::node_options o;
  o.job_token = "t";
  o.default_timeout = 5s;
  return o;
}

}  // namespace

TEST_CASE("a fault plan parses every field and prints back to an equal plan", "[fault][plan]") {
  const auto plan = troupe::fault_plan::parse(
      "# comment\nseed 42\nrule troupe.rref.fork_request fail_first=3 drop=0.25 drop_reply=0.5\n"
      "rule * duplicate=0.1 delay=2..9 reorder=7  # trailing\n");
  REQUIRE(plan.rules.size() == 2);
  CHECK(plan.seed == 42);
  CHECK(plan.rules[0].match == "troupe.rref.fork_request");
  CHECK(plan.rules[0].fail_first == 3);
  CHECK(plan.rules[0].drop == 0.25);
  CHECK(plan.rules[0].drop_reply == 0.5);
  CHECK(plan.rules[1].duplicate == 0.1);
  CHECK(plan.rules[1].delay_min == 2ms);
  CHECK(plan.rules[1].delay_max == 9ms);
  CHECK(plan.rules[1].reorder == 7ms);
  const auto again = troupe::fault_plan::parse(plan.to_string());
  CHECK(again.to_string() == plan.to_string());
}

TEST_CASE("a malformed fault plan is refused naming the line and the field", "[fault][plan]") {
  auto message_of = [](const std::string& text) {
    try {
      troupe::fault_plan::parse(text);
    } catch (const troupe::error& e) {
      CHECK(e.code() == errc::bad_argument);
      return e.message();
    }
    return std::string("no error");
  };
  CHECK_THAT(message_of("seed 1\nrule f drop=1.5\n"), Catch::Contains("line 2") && Catch::Contains("drop=1.5"));
  CHECK_THAT(message_of("rule f bogus=1\n"), Catch::Contains("unknown field 'bogus'"));
  CHECK_THAT(message_of("rule f delay=9..2\n"), Catch::Contains("max < min"));
  CHECK_THAT(message_of("frobnicate\n"), Catch::Contains("expected 'seed', 'rule', 'partition', 'drop_heartbeats', 'kill', 'pause' or 'delay'"));
  // Fault events: partitions, kills and pauses.
  CHECK_THAT(message_of("seed 1\npartition a\n"), Catch::Contains("line 2") && Catch::Contains("two worker lists"));
  CHECK_THAT(message_of("partition a b hold\n"), Catch::Contains("needs for=MS"));
  CHECK_THAT(message_of("kill step worker=w\n"), Catch::Contains("needs step=N"));
  CHECK_THAT(message_of("pause step step=1\n"), Catch::Contains("pause needs for=MS"));
  CHECK_THAT(message_of("kill step step=1 for=3\n"), Catch::Contains("unknown kill field 'for=3'"));
  CHECK_THROWS_AS(troupe::fault_plan::load("/nonexistent/plan.txt"), troupe::error);
}

TEST_CASE("the same seed replays the same faults and another seed gives others", "[fault][plan]") {
  auto plan = troupe::fault_plan::parse("seed 7\nrule * drop=0.3 duplicate=0.3 delay=0..20\n");
  const auto a = decisions(plan, 200), b = decisions(plan, 200);
  plan.seed = 8;
  const auto c = decisions(plan, 200);
  int same_ab = 0, same_ac = 0, drops = 0, dups = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    same_ab += a[i].copies == b[i].copies && a[i].delay == b[i].delay;
    same_ac += a[i].copies == c[i].copies && a[i].delay == c[i].delay;
    drops += a[i].copies == 0;
    dups += a[i].copies == 2;
    CHECK(a[i].delay <= 20ms);
  }
  CHECK(same_ab == 200);
  CHECK(same_ac < 150);
  CHECK(drops > 30);  // ~60 expected
  CHECK(drops < 90);
  CHECK(dups > 20);
}

TEST_CASE("fail_first drops exactly the first N requests of its key and no other key", "[fault][plan]") {
  troupe::fault_injector inj(troupe::fault_plan::parse("rule g fail_first=3\n"));
  for (int i = 0; i < 6; ++i) {
    auto g = request("g", static_cast<std::uint64_t>(i));
    auto h = request("h", static_cast<std::uint64_t>(100 + i));
    CHECK(inj.on_send(g).copies == (i < 3 ? 0 : 1));
    CHECK(inj.on_send(h).copies == 1);
  }
  CHECK(inj.counters().dropped_requests == 3);
}

TEST_CASE("a reply is matched to its function through the request the callee received", "[fault][plan]") {
  troupe::fault_injector inj(troupe::fault_plan::parse("rule g drop_reply=1\n"));
  auto req = request("g", 5);
  CHECK(inj.on_send(req).copies == 1);  // requests of g are not dropped
  CHECK(inj.on_receive(req).copies == 1);
  troupe::envelope reply{troupe::message_kind::rpc_response, "worker1", "worker0", 5, {}, {}, {}};
  CHECK(inj.on_send(reply).copies == 0);
  troupe::envelope other{troupe::message_kind::rpc_response, "worker1", "worker0", 6, {}, {}, {}};
  CHECK(inj.on_send(other).copies == 1);  // unknown call: no rule for plain responses
  CHECK(inj.counters().dropped_replies == 1);
}

TEST_CASE("reorder delays messages within its window so later ones overtake", "[fault][plan]") {
  const auto d = decisions(troupe::fault_plan::parse("seed 3\nrule * reorder=10\n"), 100);
  bool overtaken = false;
  for (std::size_t i = 0; i + 1 < d.size(); ++i) {
    CHECK(d[i].delay <= 10ms);
    overtaken = overtaken || d[i + 1].delay < d[i].delay;
  }
  CHECK(overtaken);
}

TEST_CASE("through a node a lost request never runs the function and a lost reply does", "[fault][plan][node]") {
  auto inj = std::make_shared<troupe::fault_injector>(troupe::fault_plan::parse("rule lost_req fail_first=1\nrule lost_rep drop_reply=1\n"));
  troupe::node n(solo(), {}, inj);
  std::atomic<int> req_runs{0}, rep_runs{0};
  n.functions().add("lost_req", [&](int x) { ++req_runs; return x; });
  n.functions().add("lost_rep", [&](int x) { ++rep_runs; return x; });
  auto expect_timeout = [&](const char* fn) {
    try {
      troupe::rpc_sync<int>(n, "worker0", fn, troupe::rpc::deadline{150ms}, 1);
      FAIL("no error");
    } catch (const troupe::error& e) {
      CHECK(e.code() == errc::timeout);
    }
  };
  expect_timeout("lost_req");
  CHECK(req_runs == 0);
  CHECK(troupe::rpc_sync<int>(n, "worker0", "lost_req", troupe::rpc::deadline{2s}, 4) == 4);  // only the first fails
  CHECK(req_runs == 1);
  expect_timeout("lost_rep");
  CHECK(rep_runs == 1);
  n.shutdown(troupe::shutdown_mode::immediate);
}

TEST_CASE("a fault plan count beyond its field or a delay beyond an hour is refused", "[fault][plan]") {
  auto refused = [](const std::string& text) {
    try {
      troupe::fault_plan::parse(text);
    } catch (const troupe::error& e) {
      CHECK(e.code() == errc::bad_argument);
      return e.message();
    }
    return std::string("no error");
  };
  // fail_first used to wrap to a negative int, which to_string() printed and parse() refused.
  CHECK_THAT(refused("rule f fail_first=3000000000\n"), Catch::Contains("fail_first=3000000000"));
  // Delays and windows this large overflowed the injector's arithmetic (undefined behaviour).
  CHECK_THAT(refused("rule f delay=0..9223372036854775807\n"), Catch::Contains("delay"));
  CHECK_THAT(refused("rule f reorder=3600001\n"), Catch::Contains("reorder=3600001"));
  CHECK(troupe::fault_plan::parse("rule f fail_first=2147483647\n").rules.at(0).fail_first == 2147483647);
  const auto longest = troupe::fault_plan::parse("rule f delay=3600000 reorder=3600000\n");
  const auto d = decisions(longest, 1);
  CHECK(d.at(0).delay >= 3600000ms);
  CHECK(d.at(0).delay <= 7200000ms);
}

TEST_CASE("every fault plan that once broke the parser is refused or reads back equal", "[fault][plan][fuzz]") {
  // fuzz/regressions/fault_plan/: the inputs the fault_plan harness found (fuzz/README.md).
  const std::filesystem::path dir = TROUPE_FUZZ_REGRESSIONS "/fault_plan";
  REQUIRE(std::filesystem::is_directory(dir));
  int inputs = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(f.path(), std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ++inputs;
    INFO(f.path().filename().string());
    try {
      const auto plan = troupe::fault_plan::parse(text);
      CHECK(troupe::fault_plan::parse(plan.to_string()).to_string() == plan.to_string());
      (void)decisions(plan, 3);
    } catch (const troupe::error& e) {
      CHECK(e.code() == errc::bad_argument);
    }
  }
  CHECK(inputs > 0);
}
