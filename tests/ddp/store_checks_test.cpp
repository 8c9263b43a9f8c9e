// The NCCL group's checks that need no device: fingerprints and the monitored barrier through a
// store (Note [NCCL fingerprints]), the watchdog's periodic thread, and device-completed works.
#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "periodic_thread.hpp"
#include "store_checks.hpp"
#include "work_state.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using ddp::detail::store_checks;

namespace {

/// An in-memory store shared by threads playing the ranks.
struct memory_store {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::string> kv;

  ddp::detail::check_store client() {
    return {[this](const std::string& k, const std::string& v) {
              {
                std::lock_guard<std::mutex> l(mu);
                kv[k] = v;
              }
              cv.notify_all();
            },
            [this](const std::string& k, std::chrono::milliseconds t) {
              std::unique_lock<std::mutex> l(mu);
              if (!cv.wait_for(l, t, [&] { return kv.count(k) > 0; }))
                throw error(errc::timeout, "memory_store: key '" + k + "' not set");
              return kv[k];
            },
            [this](const std::string& k) {
              std::lock_guard<std::mutex> l(mu);
              kv.erase(k);
            }};
  }
  std::size_t size() {
    std::lock_guard<std::mutex> l(mu);
    return kv.size();
  }
};

/// Runs fn(rank) on `world` threads and returns what each threw (empty: nothing).
std::vector<std::string> on_ranks(int world, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(static_cast<std::size_t>(world));
  std::vector<std::thread> ts;
  for (int r = 0; r < world; ++r)
    ts.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  return errors;
}

}  // namespace

TEST_CASE("ranks that issue the same collectives pass the store fingerprint check and leave a bounded number of keys",
          "[ddp][nccl]") {
  memory_store ms;
  const auto errors = on_ranks(3, [&](int rank) {
    store_checks c(ms.client(), "g", rank, 3, "rank " + std::to_string(rank));
    for (std::uint64_t seq = 1; seq <= 20; ++seq) {
      const auto e = c.compare(seq, "allreduce(sum) float32[" + std::to_string(seq) + "]", 10s);
      if (e) throw *e;
    }
  });
  for (const auto& e : errors) CHECK(e.empty());
  CHECK(ms.size() <= 6);  // at most the last two sequence numbers of each rank
}

TEST_CASE("a fingerprint that differs on one rank fails every rank with collective_mismatch naming both", "[ddp][nccl]") {
  memory_store ms;
  std::vector<std::optional<error>> got(3);
  on_ranks(3, [&](int rank) {
    store_checks c(ms.client(), "g", rank, 3, "rank " + std::to_string(rank));
    got[static_cast<std::size_t>(rank)] = c.compare(1, rank == 2 ? "allreduce(sum) float32[8]" : "allreduce(sum) float32[4]", 10s);
  });
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r);
    REQUIRE(got[static_cast<std::size_t>(r)].has_value());
    CHECK(got[static_cast<std::size_t>(r)]->code() == errc::collective_mismatch);
    CHECK_THAT(got[static_cast<std::size_t>(r)]->message(), Catch::Contains("float32[8]") && Catch::Contains("float32[4]"));
  }
  CHECK_THAT(got[0]->message(), Catch::Contains("rank 2 issued #1 allreduce(sum) float32[8]"));
}

TEST_CASE("a rank that never issues the collective is named in a timeout error", "[ddp][nccl]") {
  memory_store ms;
  std::vector<std::optional<error>> got(3);
  on_ranks(3, [&](int rank) {
    if (rank == 1) return;  // dead or hung
    store_checks c(ms.client(), "g", rank, 3, "rank " + std::to_string(rank));
    got[static_cast<std::size_t>(rank)] = c.compare(1, "broadcast from 0 float32[4]", 200ms);
  });
  for (int r : {0, 2}) {
    REQUIRE(got[static_cast<std::size_t>(r)].has_value());
    CHECK(got[static_cast<std::size_t>(r)]->code() == errc::timeout);
    CHECK_THAT(got[static_cast<std::size_t>(r)]->message(), Catch::Contains("rank(s) 1 did not issue it"));
  }
}

TEST_CASE("a rank whose payload was dropped fails every peer's fingerprint check at once with peer_lost and its reason",
          "[ddp][nccl][fault]") {
  memory_store ms;
  std::vector<std::optional<error>> got(3);
  const auto errors = on_ranks(3, [&](int rank) {
    store_checks c(ms.client(), "g", rank, 3, "rank " + std::to_string(rank));
    if (auto e = c.compare(1, "allreduce(sum) float32[4]", 10s)) throw *e;
    c.repeat_last();  // a repeated entry: nobody reads it again
    if (rank == 1) return c.publish_lost(2, "the fault plan dropped rank 1's payload of allreduce #2");
    const auto start = std::chrono::steady_clock::now();
    got[static_cast<std::size_t>(rank)] = c.compare(2, "allreduce(sum) float32[4]", 20s);
    if (std::chrono::steady_clock::now() - start > 5s) throw error(errc::timeout, "waited for the deadline");
  });
  for (const auto& e : errors) CHECK(e.empty());
  for (int r : {0, 2}) {
    INFO("rank " << r);
    REQUIRE(got[static_cast<std::size_t>(r)].has_value());
    CHECK(got[static_cast<std::size_t>(r)]->code() == errc::peer_lost);
    CHECK_THAT(got[static_cast<std::size_t>(r)]->message(), Catch::Contains("dropped rank 1's payload of allreduce #2"));
  }
}

TEST_CASE("a store monitored barrier passes when all arrive and names every rank that did not", "[ddp][nccl]") {
  memory_store ms;
  auto errors = on_ranks(3, [&](int rank) { store_checks(ms.client(), "g", rank, 3, "x").monitored_barrier(10s); });
  for (const auto& e : errors) CHECK(e.empty());
  memory_store ms2;
  errors = on_ranks(4, [&](int rank) {
    if (rank >= 2) return;
    store_checks(ms2.client(), "g", rank, 4, "x").monitored_barrier(200ms);
  });
  CHECK_THAT(errors[0], Catch::Contains("rank(s) 2, 3 did not arrive"));
  CHECK_THAT(errors[1], Catch::Contains("rank(s) 2, 3 did not arrive"));
}

TEST_CASE("a periodic thread runs its step until it is destroyed, also after a step threw", "[ddp]") {
  std::mutex mu;
  std::condition_variable cv;
  int ticks = 0;
  {
    ddp::detail::periodic_thread t(1ms, [&] {
      {
        std::lock_guard<std::mutex> l(mu);
        ++ticks;
      }
      cv.notify_all();
      throw error(errc::invalid_state, "a failing step");
    });
    std::unique_lock<std::mutex> l(mu);
    REQUIRE(cv.wait_for(l, 10s, [&] { return ticks >= 3; }));
  }
  std::lock_guard<std::mutex> l(mu);
  const int at_stop = ticks;
  std::this_thread::yield();
  CHECK(ticks == at_stop);  // the thread was joined: nothing runs any more
}

TEST_CASE("a work completed by a device delegates wait, completion, errors and stream order", "[ddp]") {
  std::atomic<bool> finished{false};
  std::atomic<int> synced{0};
  auto s = std::make_shared<ddp::work::state>();
  s->description = "fake device allreduce";
  s->device = ddp::work::state::device_completion{
      [&](std::chrono::milliseconds) {
        if (!finished) throw error(errc::timeout, "fake device allreduce did not complete");
      },
      [&] { return finished.load(); }, [] { return std::optional<error>(); }, [&] { ++synced; }};
  ddp::work w(s);
  CHECK_FALSE(w.is_completed());
  CHECK_FALSE(w.completed_at().has_value());
  CHECK_THROWS_AS(w.wait(1ms), error);
  w.synchronize_stream();
  CHECK(synced == 1);
  finished = true;
  w.wait(1ms);
  CHECK(w.is_completed());
  CHECK(w.completed_at().has_value());
  const ddp::work failed = ddp::detail::failed_work("refused", error(errc::collective_mismatch, "ranks disagree"));
  CHECK(failed.is_completed());
  REQUIRE(failed.error().has_value());
  CHECK(failed.error()->code() == errc::collective_mismatch);
}
