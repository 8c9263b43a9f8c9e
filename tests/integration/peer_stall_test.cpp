// A frozen or dead store host (rank 0) across processes:
// - a 2 s stall is re-admitted on both sides (Note [lost peer re-admission]);
// - a real freeze fails every call and store call with peer_lost naming it;
// - losing the store host is an event every node sees at once (Note [peer loss events]).
// The parent runs no node: it freezes, resumes and kills the ranks.
#include <catch2/catch.hpp>
#include <future>
#include <thread>

#include "integration/node_harness.hpp"
#include "integration/stall_probe.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

using clock_type = std::chrono::steady_clock;

// Rank 0, the store host: serves "echo" until told to call back, then calls worker1, which
// stays up until this side is done ("done/0").
void store_host(troupe::test::port_pipe& pipe, troupe::test::port_pipe& resume, troupe::test::stall_probe& probe) {
  troupe::node n(troupe::test::test_options(0, 2, 0));
  n.functions().add("echo", [](int x) { return x; });
  pipe.publish(n.port(), 1);
  n.store().wait({"ready/1"}, 20s);
  resume.read(60s);
  // This side re-admits worker1 too: a call to it succeeds again.
  troupe::test::stall_report r;
  r.rank = 0;
  for (const auto end = clock_type::now() + 10s; !r.ok && clock_type::now() < end;) {
    try {
      r.ok = troupe::rpc_sync<int>(n, "worker1", "echo", 7, 2s) == 7;
    } catch (const error& e) {
      ++r.count;
      r.code = static_cast<int>(e.code());
      std::strncpy(r.text, e.message().c_str(), sizeof(r.text) - 1);  // the last failure
    }
  }
  r.ms = probe.ms_since();
  probe.report(r);
  n.store().set("done/0", "1");  // worker1 stays up until this side's calls are over
  n.store().get("done/1", 30s);
}

// Rank 1: calls worker0 in a loop across the stall until a call succeeds after a failure.
void caller_through_stall(troupe::test::port_pipe& pipe, troupe::test::stall_probe& probe) {
  troupe::node n(troupe::test::test_options(1, 2, pipe.read()));
  n.functions().add("echo", [](int x) { return x; });
  if (troupe::rpc_sync<int>(n, "worker0", "echo", 7) != 7) throw error(errc::invalid_state, "first call is wrong");
  n.store().set("ready/1", "1");
  probe.report_outcome(1, nullptr, -1, true);  // the parent may freeze rank 0 now
  troupe::test::stall_report r;
  r.rank = 1;
  bool readmitted = false;
  for (const auto end = clock_type::now() + 20s; !readmitted && clock_type::now() < end;) {
    try {
      readmitted = troupe::rpc_sync<int>(n, "worker0", "echo", 7, 5s) == 7 && r.count > 0;
      if (!readmitted) std::this_thread::sleep_for(20ms);  // pacing, until the parent froze rank 0
    } catch (const error& e) {
      if (r.count++ == 0) {
        r.code = static_cast<int>(e.code());
        r.ms = probe.ms_since();
        std::strncpy(r.text, e.message().c_str(), sizeof(r.text) - 1);
      }
    }
  }
  r.ok = readmitted && n.store().get("ready/1", 5s) == "1";  // the store host is back too
  probe.report(r);
  n.store().get("done/0", 30s);
  n.store().set("done/1", "1");
}

// Rank 1 while rank 0 stays frozen. All end in peer_lost: the call it starts once the parent
// froze rank 0, the store-host event, a store call and a later call.
void caller_of_frozen_host(troupe::test::port_pipe& pipe, troupe::test::port_pipe& frozen, troupe::test::stall_probe& probe) {
  troupe::node n(troupe::test::test_options(1, 2, pipe.read()));
  if (troupe::rpc_sync<int>(n, "worker0", "echo", 7) != 7) throw error(errc::invalid_state, "first call is wrong");
  probe.report_outcome(1, nullptr, -1, true);
  frozen.read(60s);  // rank 0 is stopped now: the next call cannot be answered before it
  troupe::test::stall_report r;
  r.rank = 1;
  std::string text;
  try {
    troupe::rpc_sync<int>(n, "worker0", "echo", 7, 20s);
    text = "the call to a frozen worker0 succeeded; ";
  } catch (const error& e) {
    r.code = static_cast<int>(e.code());
    r.ms = probe.ms_since();
    text = "call: " + e.message() + "; ";
  }
  auto lost = n.peer_losses()->store_host_lost();
  const bool event = lost.wait_for(3s) == std::future_status::ready && lost.get().worker == "worker0" && lost.get().store_host;
  bool store_failed = false, later_failed = false;
  const auto t0 = clock_type::now();
  try {
    n.store().get("ready/1", 5s);
  } catch (const error& e) {
    store_failed = e.code() == errc::peer_lost && e.message().find("rank 0") != std::string::npos;
    text += "store: " + e.message() + "; ";
  }
  try {
    troupe::rpc_sync<int>(n, "worker0", "echo", 7, 20s);
  } catch (const error& e) {
    later_failed = e.code() == errc::peer_lost && e.message().find("worker0") != std::string::npos;
    text += "later call: " + e.message();
  }
  r.count = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0).count());
  r.ok = event && store_failed && later_failed;
  std::strncpy(r.text, text.c_str(), sizeof(r.text) - 1);
  probe.report(r);
}

// Ranks 1 and 2 when the store host dies: the event, then the named error of the next store call.
void watcher_of_store_host(int rank, troupe::test::port_pipe& pipe, troupe::test::stall_probe& probe) {
  troupe::node n(troupe::test::test_options(rank, 3, pipe.read()));
  n.store().set("ready/" + std::to_string(rank), "1");
  probe.report_outcome(rank, nullptr, -1, true);
  auto lost = n.peer_losses()->store_host_lost();
  troupe::test::stall_report r;
  r.rank = rank;
  if (lost.wait_for(10s) != std::future_status::ready) throw error(errc::timeout, "no store-host event");
  r.ms = probe.ms_since();
  r.ok = lost.get().worker == "worker0" && lost.get().store_host;
  try {
    n.store().set("after", "1");
  } catch (const error& e) {
    r.code = static_cast<int>(e.code());
    std::strncpy(r.text, e.message().c_str(), sizeof(r.text) - 1);
  }
  probe.report(r);
}

}  // namespace

TEST_CASE("a store host stopped for 2 s is re-admitted: calls and store calls succeed again on both sides",
          "[actors][rpc][supervision]") {
  troupe::test::port_pipe pipe, resume;
  troupe::test::stall_probe probe;
  auto children = spawn_children(2, [&](int rank) {
    if (rank == 0) store_host(pipe, resume, probe);
    else caller_through_stall(pipe, probe);
  });
  REQUIRE(probe.read(30s).ok);
  REQUIRE(troupe::test::freeze(children.pids()[0]));
  probe.stamp();
  std::this_thread::sleep_for(2s);  // the stall itself, twice the peer timeout
  REQUIRE(::kill(children.pids()[0], SIGCONT) == 0);
  resume.publish(0, 1);
  for (int i = 0; i < 2; ++i) {
    const auto r = probe.read(40s);
    INFO("rank " << r.rank << ": " << r.text);
    CHECK(r.ok);
    if (r.rank == 1) {
      CHECK(r.code == static_cast<int>(errc::peer_lost));
      CHECK_THAT(std::string(r.text), Catch::Contains("worker0"));
      CHECK(r.count >= 1);
      CHECK(r.ms < 3000);
      WARN("2 s stall: worker0 declared lost " << r.ms << " ms after the SIGSTOP; " << r.count << " calls failed before re-admission");
    }
  }
  CHECK(children.join(30s));
}

TEST_CASE("a store host frozen for good fails the pending call, the store and later calls with peer_lost naming it",
          "[actors][rpc][supervision]") {
  troupe::test::port_pipe pipe, frozen;
  troupe::test::stall_probe probe;
  auto children = spawn_children(2, [&](int rank) {
    if (rank == 0) {
      troupe::test::port_pipe unused;
      store_host(pipe, unused, probe);
    } else {
      caller_of_frozen_host(pipe, frozen, probe);
    }
  });
  REQUIRE(probe.read(30s).ok);
  REQUIRE(troupe::test::freeze(children.pids()[0]));
  probe.stamp();
  frozen.publish(0, 1);
  const auto r = probe.read(40s);
  INFO(r.text);
  CHECK(r.code == static_cast<int>(errc::peer_lost));
  CHECK(r.ms < 3000);
  CHECK(r.ok);
  CHECK(r.count < 5000);  // the store call and the later call together are bounded
  WARN("real freeze: the pending call failed " << r.ms << " ms after the SIGSTOP; store call + later call took " << r.count << " ms");
  children.kill(0, SIGKILL);
  CHECK_THROWS_AS(children.join(10s), troupe::error);
}

TEST_CASE("every node learns at once that the store host died, and its next store call names it",
          "[actors][store][supervision]") {
  troupe::test::port_pipe pipe;
  troupe::test::stall_probe probe;
  auto children = spawn_children(3, [&](int rank) {
    if (rank == 0) {
      troupe::node n(troupe::test::test_options(0, 3, 0));
      pipe.publish(n.port(), 2);
      n.store().get("never", 60s);
    } else {
      watcher_of_store_host(rank, pipe, probe);
    }
  });
  REQUIRE(probe.read(30s).ok);
  REQUIRE(probe.read(30s).ok);
  probe.stamp();
  children.kill(0, SIGKILL);
  for (int i = 0; i < 2; ++i) {
    const auto r = probe.read(20s);
    INFO("rank " << r.rank << ": " << r.text);
    CHECK(r.ok);
    CHECK(r.ms < 2000);
    CHECK(r.code == static_cast<int>(errc::peer_lost));
    CHECK_THAT(std::string(r.text), Catch::Contains("rank 0"));
    WARN("store host SIGKILLed: rank " << r.rank << " got the event " << r.ms << " ms later");
  }
  CHECK_THROWS_AS(children.join(10s), troupe::error);
}
