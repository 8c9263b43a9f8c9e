#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include <unistd.h>

#include "troupe/actors/flight_recorder.hpp"
#include "troupe/tensors/error.hpp"

using troupe::flight_recorder;
using troupe::trace_kind;

TEST_CASE("a flight recorder keeps the last operations in the order they began", "[actors][recorder]") {
  flight_recorder rec(4);
  for (std::uint64_t i = 1; i <= 6; ++i) rec.end(rec.begin(trace_kind::collective, "allreduce", i, "bucket " + std::to_string(i % 2)));
  const auto t = rec.begin(trace_kind::rpc_call, "push", 77, "worker1");
  const auto last = rec.last();
  REQUIRE(last.size() == 4);
  CHECK(last[0].seq == 4);
  CHECK(last[2].seq == 6);
  CHECK(last[2].detail == "bucket 0");
  CHECK(last[2].ended.has_value());
  CHECK(last[3].kind == trace_kind::rpc_call);
  CHECK(last[3].name == "push");
  CHECK_FALSE(last[3].ended.has_value());
  rec.end(t, false);
  const auto after = rec.last(1);
  REQUIRE(after.size() == 1);
  CHECK(after[0].ended.has_value());
  CHECK_FALSE(after[0].ok);
  CHECK(rec.highest_seq(trace_kind::collective, "allreduce") == std::optional<std::uint64_t>(6));
  CHECK_FALSE(rec.highest_seq(trace_kind::collective, "broadcast").has_value());
}

TEST_CASE("ending an operation whose slot was reused changes nothing", "[actors][recorder]") {
  flight_recorder rec(2);
  const auto old = rec.begin(trace_kind::collective, "allreduce", 1);
  rec.begin(trace_kind::collective, "allreduce", 2);
  rec.begin(trace_kind::collective, "allreduce", 3);  // reuses old's slot
  rec.end(old, false);
  const auto last = rec.last();
  REQUIRE(last.size() == 2);
  CHECK(last[1].seq == 3);
  CHECK_FALSE(last[1].ended.has_value());
  CHECK(last[1].ok);
}

TEST_CASE("names longer than the slot are cut, never overflow", "[actors][recorder]") {
  flight_recorder rec(2);
  const std::string longname(200, 'x');
  rec.begin(trace_kind::rpc_serve, longname, 1, longname);
  const auto last = rec.last();
  REQUIRE(last.size() == 1);
  CHECK(last[0].name == std::string(flight_recorder::max_name, 'x'));
  CHECK(last[0].detail == std::string(flight_recorder::max_detail, 'x'));
}

TEST_CASE("concurrent writers and a reader see only whole entries", "[actors][recorder]") {
  flight_recorder rec(64);
  std::atomic<bool> stop{false};
  std::vector<std::thread> writers;
  for (int w = 0; w < 3; ++w)
    writers.emplace_back([&, w] {
      const std::string name = "op" + std::to_string(w);
      for (std::uint64_t i = 0; i < 20000; ++i) rec.end(rec.begin(trace_kind::collective, name, i * 3 + w, name));
    });
  std::atomic<std::size_t> seen{0}, torn{0};
  std::string first_torn;
  std::thread reader([&] {
    bool last_round = false;
    while (!last_round) {
      last_round = stop.load();  // one more read after the writers ended
      for (const auto& e : rec.last()) {
        // Every field of an entry comes from the same begin: the name matches the seq's writer.
        if (e.name != "op" + std::to_string(e.seq % 3) || e.detail != e.name) {
          if (torn++ == 0) first_torn = e.name + "/" + e.detail + "/" + std::to_string(e.seq);
        }
        ++seen;
      }
    }
  });
  for (auto& t : writers) t.join();
  stop = true;
  reader.join();
  INFO("first torn entry: " << first_torn);
  CHECK(torn == 0);
  CHECK(seen > 0);
  // A writer preempted for a whole turn of the ring may leave its slot unrecorded, never torn.
  CHECK(rec.last().size() >= 60);
}

TEST_CASE("a hang report names the ranks that never entered and how long the others waited", "[actors][recorder]") {
  using troupe::rank_position;
  std::vector<rank_position> ranks = {{0, 118, "bucket 2"}, {1, 118, "bucket 2"}, {2, 118, "bucket 2"}, {3, 117, "bucket 1"}};
  CHECK(troupe::hang_report("allreduce", 118, "bucket 2", ranks, std::chrono::milliseconds(2000)) ==
        "rank 3 never entered allreduce #118 (bucket 2); its last was #117 (bucket 1); ranks 0-2 waited 2.0 s");
  ranks[3] = {3, std::nullopt, "", false};
  CHECK(troupe::hang_report("allreduce", 118, "bucket 2", ranks, std::chrono::milliseconds(1500)) ==
        "rank 3 did not answer (dead or frozen); ranks 0-2 waited 1.5 s");
  ranks[3] = {3, 118, "bucket 2"};
  CHECK(troupe::hang_report("allreduce", 118, "", ranks, std::chrono::milliseconds(100)) ==
        "every rank entered allreduce #118; ranks 0-3 waited 0.1 s");
  CHECK(troupe::rank_ranges({5, 0, 2, 1, 7, 6}) == "0-2,5-7");
}

TEST_CASE("a chrome trace holds one complete event per kept operation", "[actors][recorder]") {
  flight_recorder rec(8);
  rec.end(rec.begin(trace_kind::collective, "allreduce", 1, "bucket \"0\""));
  rec.begin(trace_kind::backward, "backward", 2);
  const std::string json = rec.chrome_trace(3, "worker3");
  CHECK(json.rfind("{\"traceEvents\":[", 0) == 0);
  CHECK(json.find("\"name\":\"allreduce #1\"") != std::string::npos);
  CHECK(json.find("bucket \\\"0\\\"") != std::string::npos);
  CHECK(json.find("\"running\":true") != std::string::npos);
  CHECK(json.find("\"name\":\"worker3\"") != std::string::npos);
  const auto dir = std::filesystem::temp_directory_path() / ("troupe_trace_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  rec.write_chrome_trace(dir.string(), 3, "worker3");
  std::ifstream f(dir / "trace-rank3.json");
  std::stringstream ss;
  ss << f.rdbuf();
  // The running operation's duration grows between the two calls; the rest is the same.
  CHECK(ss.str().substr(0, json.find("\"dur\"")) == json.substr(0, json.find("\"dur\"")));
  CHECK(ss.str().find("\"name\":\"backward #2\"") != std::string::npos);
  std::filesystem::remove_all(dir);
  CHECK_THROWS_AS(rec.write_chrome_trace("/nonexistent/dir", 3, "w"), troupe::error);
}

TEST_CASE("a recorder writes its trace to the target it was given, and nowhere without one", "[actors][recorder]") {
  const auto dir = std::filesystem::temp_directory_path() / ("troupe_target_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  flight_recorder rec(4, troupe::trace_target{dir.string(), 7, "worker7"});
  rec.end(rec.begin(trace_kind::rpc_call, "f", 1, "worker1"));
  CHECK(rec.write_trace());
  CHECK(std::filesystem::exists(dir / "trace-rank7.json"));
  CHECK_FALSE(std::filesystem::exists(dir / "trace-rank7.json.tmp"));
  const flight_recorder untargeted(4);
  CHECK_FALSE(untargeted.write_trace());
  const flight_recorder misdirected(4, troupe::trace_target{(dir / "missing").string(), 1, "w"});
  CHECK_FALSE(misdirected.write_trace());
  std::filesystem::remove_all(dir);
}
