// Partitions and freezes between namespace hosts:
// - a host cut off (nftables drop, both directions) or frozen (SIGSTOP) during an rpc fails
//   every caller on the other host with peer_lost naming the callee within 2 s;
// - after a heal, a new job on the same hosts runs;
// - a cut shorter than the connection timeout loses nothing.
#include <deque>
#include <future>
#include <sstream>

#include <catch2/catch.hpp>

#include "multihost/direct_ranks.hpp"
#include "multihost/rank_env.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/dist_autograd/container.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace std::chrono_literals;
using troupe::test::worker;

namespace {

struct lost_report {
  bool seen = false;
  long long at_ms = 0;
  int code = -1;
  std::string text;
};

// Parses "LOST <wall ms> <errc> <text>" from a rank's output.
lost_report parse_lost(const std::string& out) {
  lost_report r;
  const auto at = out.find("LOST ");
  if (at == std::string::npos) return r;
  std::istringstream in(out.substr(at + 5));
  in >> r.at_ms >> r.code;
  std::getline(in, r.text);
  r.seen = true;
  return r;
}

// Cuts or freezes host 1 while ranks 0..callers-1 wait on ranks 2.. (rank r on rank r + 2) in the
// rank program `tag`; checks that every caller saw peer_lost naming its callee within 2 s.
void survivors_see_peer_lost(troupe::test::netns_bed& bed, bool freeze, const std::string& tag = "[.mh_hold_rank]", int callers = 2) {
  const auto marks = troupe::test::mark_dir(bed);
  auto ranks = troupe::test::start_direct_ranks(bed, tag);
  std::vector<std::string> held;
  for (int r = 0; r < callers; ++r) held.push_back("held-" + std::to_string(r + 2));
  REQUIRE(troupe::test::await_marks(marks, held, 60s));
  const long long t_cut = freeze ? bed.freeze(1) : bed.cut(1);  // the moment the cut went in
  for (int r = 0; r < callers; ++r) {
    CHECK(ranks[static_cast<std::size_t>(r)].wait(20s) == 0);
    const auto out = ranks[static_cast<std::size_t>(r)].output();
    INFO("rank " << r << ":\n" << out);
    const auto lost = parse_lost(out);
    REQUIRE(lost.seen);
    CHECK(lost.code == static_cast<int>(troupe::errc::peer_lost));
    CHECK_THAT(lost.text, Catch::Contains(worker(r + 2)));
    CHECK(lost.at_ms - t_cut < 2000);
  }
  if (freeze) bed.thaw(1);
  else bed.heal(1);
}

}  // namespace

TEST_CASE("a host cut off during an rpc fails the callers with peer_lost within 2 s, and after a heal a new job runs",
          "[multihost][partition]") {
  troupe::test::netns_bed bed(2);
  troupe::test::require_bed(bed);
  survivors_see_peer_lost(bed, false);
  // The same hosts, healed: a new job (another port) calls across them.
  auto again = troupe::test::start_direct_ranks(bed, "[.mh_blip_rank]", 29501);
  REQUIRE(troupe::test::await_marks(troupe::test::mark_dir(bed), {"calling-0", "calling-1"}, 60s));
  troupe::test::set_mark(troupe::test::mark_dir(bed), "healed");
  for (auto& r : again) {
    CHECK(r.wait(30s) == 0);
    INFO(r.output());
  }
}

TEST_CASE("a host frozen during an rpc fails the callers with peer_lost within 2 s", "[multihost][partition]") {
  troupe::test::netns_bed bed(2);
  troupe::test::require_bed(bed);
  survivors_see_peer_lost(bed, true);
}

TEST_CASE("a host cut off during a distributed backward fails the backward with peer_lost within 2 s", "[multihost][partition]") {
  troupe::test::netns_bed bed(2);
  troupe::test::require_bed(bed);
  survivors_see_peer_lost(bed, false, "[.mh_backward_rank]", 1);
}

TEST_CASE("a cut of 200 ms loses nothing: the calls in flight and the later ones complete", "[multihost][partition]") {
  troupe::test::netns_bed bed(2);
  troupe::test::require_bed(bed);
  const auto marks = troupe::test::mark_dir(bed);
  auto ranks = troupe::test::start_direct_ranks(bed, "[.mh_blip_rank]");
  REQUIRE(troupe::test::await_marks(marks, {"calling-0", "calling-1"}, 60s));
  bed.blip(1, 200ms);
  troupe::test::set_mark(marks, "healed");
  for (auto& r : ranks) {
    const int code = r.wait(30s);
    INFO(r.output());
    CHECK(code == 0);
  }
}

// Hidden rank programs.

// Ranks 2, 3 serve "hold" (marks held-<rank>, then blocks up to 15 s); ranks 0, 1 call it and
// print "LOST <wall ms> <errc> <text>" when the call fails.
TEST_CASE("multihost hold rank", "[.mh_hold_rank]") {
  const std::string marks = troupe::test::rank_marks();
  const int rank = std::atoi(std::getenv("RANK"));
  troupe::rpc::registry reg;
  std::promise<void> never;
  auto released = never.get_future().share();
  reg.add("hold", [marks, rank, released](int) {
    troupe::test::set_mark(marks, "held-" + std::to_string(rank));
    released.wait_for(15s);  // bounded: the caller's host is cut off before this returns
    return 1;
  });
  auto o = troupe::test::rank_options();
  o.executor_threads = 2;
  troupe::node n(o, reg);
  n.store().barrier("up", rank, 4, 30s);
  if (rank < 2) {
    try {
      troupe::rpc_sync<int>(n, worker(rank + 2), "hold", 0, 30s);
      std::printf("NOT LOST\n");
    } catch (const troupe::error& e) {
      std::printf("LOST %lld %d %s\n", troupe::test::wall_ms(), static_cast<int>(e.code()), e.message().c_str());
    }
    std::fflush(stdout);
  } else {
    try {
      n.store().get("never set", 30s);  // fails once host 0 is gone
    } catch (const troupe::error&) {
    }
  }
  n.shutdown(troupe::shutdown_mode::immediate);
}

// Ranks 0, 1 call ranks 2, 3 with a window of 8 rpc_async in flight. They call until the
// "healed" mark and 50 calls more, bounded by 90 s. Every call must succeed. The mark
// calling-<rank> comes after the first 20.
TEST_CASE("multihost blip rank", "[.mh_blip_rank]") {
  const std::string marks = troupe::test::rank_marks();
  troupe::rpc::registry reg;
  reg.add("inc", [](int x) { return x + 1; });
  troupe::node n(troupe::test::rank_options(), reg);
  const int rank = n.info().rank;
  n.store().barrier("up", rank, 4, 30s);
  if (rank < 2) {
    std::deque<std::pair<int, troupe::rpc::future<int>>> window;
    int after_heal = -1;
    const auto deadline = std::chrono::steady_clock::now() + 90s;
    for (int i = 0; after_heal < 50; ++i) {
      window.emplace_back(i, troupe::rpc_async<int>(n, worker(rank + 2), "inc", i, troupe::rpc::deadline{20s}));
      if (window.size() < 8) continue;
      auto [k, f] = std::move(window.front());
      window.pop_front();
      REQUIRE(f.get() == k + 1);
      if (i == 20) troupe::test::set_mark(marks, "calling-" + std::to_string(rank));
      if (after_heal >= 0) ++after_heal;
      else if (i > 20 && troupe::test::has_mark(marks, "healed")) after_heal = 0;
      REQUIRE(std::chrono::steady_clock::now() < deadline);  // the test heals well before
    }
    for (auto& [k, f] : window) REQUIRE(f.get() == k + 1);
  }
  troupe::test::finish_rank(n);
}

// worker2 computes y = x @ w for worker0; the backward of y on worker2 marks held-2 and blocks
// (up to 15 s) in a gradient hook. worker0 runs the distributed backward and prints LOST when it
// fails.
TEST_CASE("multihost backward rank", "[.mh_backward_rank]") {
  const std::string marks = troupe::test::rank_marks();
  auto o = troupe::test::rank_options();
  troupe::dist_autograd::add_message_types(o);
  troupe::node n(o);
  const int rank = n.info().rank;
  {
    troupe::dist_autograd::container dist(n);
    troupe::generator g(3);
    troupe::tensor w = troupe::randn({3, 3}, g);
    troupe::set_requires_grad(w);
    std::promise<void> never;
    auto released = never.get_future().share();
    n.functions().add("fwd", [w, marks, released](troupe::tensor x) {
      troupe::tensor y = troupe::matmul(x, w);
      troupe::register_hook(y, [marks, released](const troupe::tensor& grad) {
        troupe::test::set_mark(marks, "held-2");
        released.wait_for(15s);  // bounded: this host is cut off meanwhile
        return grad;
      });
      return y;
    });
    n.store().barrier("up", rank, 4, 30s);
    if (rank == 0) {
      troupe::tensor x = troupe::randn({2, 3}, g);
      troupe::set_requires_grad(x);
      troupe::dist_autograd::context ctx(dist);
      try {
        const auto y = troupe::rpc_sync<troupe::tensor>(n, worker(2), "fwd", x);
        dist.backward(ctx.id(), {troupe::sum(y)});
        std::printf("NOT LOST\n");
      } catch (const troupe::error& e) {
        std::printf("LOST %lld %d %s\n", troupe::test::wall_ms(), static_cast<int>(e.code()), e.message().c_str());
      }
      std::fflush(stdout);
    } else if (rank == 2) {
      try {
        n.store().get("never set", 30s);  // fails once host 0 is gone
      } catch (const troupe::error&) {
      }
    }
  }
  if (rank != 0 && rank != 2) return;  // ranks 1 and 3 take no part; they end with their node
  n.shutdown(troupe::shutdown_mode::immediate);
}
