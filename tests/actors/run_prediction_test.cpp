// Note [predicted quick] (actors/src/executor.hpp; the rule in rpc/run_prediction.hpp): which
// requests of ordinary functions the executor's leader runs itself.
#include <catch2/catch.hpp>

#include <chrono>

#include "rpc/run_prediction.hpp"

using namespace std::chrono_literals;
using troupe::detail::led_jobs;
using troupe::detail::predicted_short;
using troupe::detail::record_run;

TEST_CASE("a function is predicted short only after 16 short runs in a row", "[actors][rpc]") {
  troupe::rpc::run_history h;
  for (int i = 0; i < 15; ++i) {
    record_run(h, 3us);
    led_jobs read;
    CHECK_FALSE(predicted_short(h, read));
  }
  record_run(h, 3us);
  led_jobs read;
  CHECK(predicted_short(h, read));
  record_run(h, 80us);  // one long run: back to the start
  led_jobs again;
  CHECK_FALSE(predicted_short(h, again));
  for (int i = 0; i < 16; ++i) record_run(h, 3us);
  led_jobs later;
  CHECK(predicted_short(h, later));
}

TEST_CASE("the quick jobs of one read stay within the short-run budget", "[actors][rpc]") {
  troupe::rpc::run_history tiny, medium;
  for (int i = 0; i < 40; ++i) {
    record_run(tiny, 3us);
    record_run(medium, 30us);
  }
  led_jobs read;
  int tiny_taken = 0;
  while (tiny_taken < 100 && predicted_short(tiny, read)) ++tiny_taken;
  CHECK(tiny_taken >= 10);  // a batch of tiny requests goes to the leader alone
  CHECK(tiny_taken <= 16);  // ~3 us each within 50 us
  led_jobs together;
  CHECK(predicted_short(medium, together));
  CHECK_FALSE(predicted_short(medium, together));  // the second goes to a follower: they run in parallel
  CHECK(predicted_short(tiny, together));           // a tiny one still fits beside the first
}

TEST_CASE("a function's expected duration rises at once and decays slowly", "[actors][rpc]") {
  troupe::rpc::run_history h;
  for (int i = 0; i < 20; ++i) record_run(h, 2us);
  record_run(h, 45us);  // still short, but the next read counts it as ~45 us
  led_jobs read;
  REQUIRE(predicted_short(h, read));
  CHECK(read.predicted_ns >= 45'000u);
  CHECK_FALSE(predicted_short(h, read));
  for (int i = 0; i < 40; ++i) record_run(h, 2us);
  led_jobs later;
  REQUIRE(predicted_short(h, later));
  CHECK(later.predicted_ns < 5'000u);
}
