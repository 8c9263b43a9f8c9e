// Fault plans on collective payloads (Note [collective payload faults]), on both CPU transports:
// - the `collective...` rule keys;
// - a dropped payload fails the collective at once on every rank, naming the rank;
// - a delayed payload changes no bit and gets the late rank named.

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/ddp_harness.hpp"
#include "troupe/actors/fault_plan.hpp"
#include "troupe/actors/flight_recorder.hpp"
#include "troupe/ddp/env_process_group.hpp"
#include "troupe/ddp/hierarchical_group.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

envelope payload_of(const std::string& op, std::uint64_t seq, int rank, const std::string& note = "") {
  envelope m;
  m.kind = message_kind::collective_payload;
  m.function = op;
  m.call_id = seq;
  m.from = "rank " + std::to_string(rank);
  m.to = "g";
  m.payload.assign(note.begin(), note.end());
  return m;
}

int copies(fault_injector& inj, envelope m) { return inj.on_send(m).copies; }

/// Group options whose payloads pass through a plan of its own (one injector per rank).
ddp::process_group_options faulted(const std::string& plan, ddp::transport_kind kind) {
  ddp::process_group_options o;
  o.transport = kind;
  o.timeout = 30s;
  auto inj = std::make_shared<fault_injector>(fault_plan::parse(plan));
  o.payload_faults = [inj](envelope& m) { return inj->on_send(m); };
  return o;
}

/// The same per-rank float values on every run: rank r's element i is a non-round number.
tensor input_of(int rank) {
  tensor t = zeros({4099});
  auto* p = t.data<float>();
  for (int i = 0; i < 4099; ++i) p[i] = 0.1f * static_cast<float>(rank + 1) + 1e-3f * static_cast<float>(i % 97) / 7.0f;
  return t;
}

bool same_bits(const tensor& a, const tensor& b) { return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0; }

const char* name_of(ddp::transport_kind k) { return k == ddp::transport_kind::tcp ? "tcp" : "shared memory"; }

}  // namespace

TEST_CASE("collective rule keys match a payload by collective, sequence number, rank and bucket", "[ddp][fault]") {
  fault_injector inj(fault_plan::parse("rule collective:allreduce:seq=3:rank=1 drop=1\n"
                                       "rule collective:bucket=2 fail_first=1\n"
                                       "rule collective:send nth=2\n"));
  CHECK(copies(inj, payload_of("allreduce", 3, 1)) == 0);
  CHECK(copies(inj, payload_of("allreduce", 3, 0)) == 1);
  CHECK(copies(inj, payload_of("allreduce", 4, 1)) == 1);
  CHECK(copies(inj, payload_of("broadcast", 3, 1)) == 1);
  CHECK(copies(inj, payload_of("allreduce", 5, 0, "bucket 2")) == 0);  // the first of bucket 2
  CHECK(copies(inj, payload_of("allreduce", 6, 0, "bucket 2")) == 1);
  CHECK(copies(inj, payload_of("allreduce", 7, 0, "bucket 12")) == 1);
  CHECK(copies(inj, payload_of("send", 1, 0)) == 1);
  CHECK(copies(inj, payload_of("send", 2, 0)) == 0);
  CHECK(inj.counters().dropped_requests == 3);
}

TEST_CASE("rules for other traffic never touch a collective payload, and collective rules no other message", "[ddp][fault]") {
  fault_injector inj(fault_plan::parse("rule collective:allreduce drop=1\nrule * drop=1\n"));
  CHECK(copies(inj, payload_of("broadcast", 1, 0)) == 1);  // `*` does not match it
  envelope call;
  call.kind = message_kind::rpc_request;
  call.function = "collective";
  CHECK(copies(inj, call) == 0);  // dropped by `*`, not by the collective rule
  fault_injector only_collective(fault_plan::parse("rule collective drop=1\n"));
  CHECK(copies(only_collective, call) == 1);
  CHECK(copies(only_collective, payload_of("barrier", 1, 2)) == 0);
}

TEST_CASE("a malformed collective key, or a lost reply of a collective payload, is refused naming the line", "[ddp][fault]") {
  CHECK_THROWS_WITH(fault_plan::parse("seed 1\nrule collective:allreduc drop=1\n"),
                    Catch::Contains("line 2") && Catch::Contains("'allreduc'"));
  CHECK_THROWS_WITH(fault_plan::parse("rule collective:seq=x drop=1\n"), Catch::Contains("line 1") && Catch::Contains("'seq=x'"));
  CHECK_THROWS_WITH(fault_plan::parse("seed 2\nrule collective drop_reply=1\n"),
                    Catch::Contains("line 2") && Catch::Contains("a collective has no reply"));
  fault_injector twice(fault_plan::parse("rule collective:bucket=1 duplicate=1\n"));
  CHECK(copies(twice, payload_of("allreduce", 1, 0, "bucket 1")) == 2);
  CHECK(twice.counters().duplicated == 1);
  const auto plan = fault_plan::parse("rule collective:allreduce:seq=2:rank=1 drop=1 delay=5..9\n");
  CHECK(fault_plan::parse(plan.to_string()).to_string() == plan.to_string());
}

TEST_CASE("a dropped allreduce payload fails the collective at once on every rank, naming the rank", "[ddp][fault]") {
  const auto kind = GENERATE(ddp::transport_kind::shared_memory, ddp::transport_kind::tcp);
  INFO(name_of(kind));
  const auto opts = faulted("rule collective:allreduce:seq=2:rank=1 drop=1\n", kind);
  REQUIRE(test::run_group(
      3,
      [](int rank, const ddp::file_store&, ddp::process_group& pg) {
        tensor t = ones({1024});
        pg.allreduce(t).wait(20s);  // #1 passes
        test::expect(t.data<float>()[0] == 3.0f, "allreduce #1 sums three ones");
        const auto start = std::chrono::steady_clock::now();
        std::string err;
        errc code = errc::ok;
        try {
          pg.allreduce(t).wait(40s);
        } catch (const error& e) {
          err = e.message();
          code = e.code();
        }
        const auto took = std::chrono::steady_clock::now() - start;
        test::expect(has(err, "the fault plan dropped rank 1's payload of allreduce #2"), "rank " + std::to_string(rank) + ": '" + err + "'");
        test::expect(code == (rank == 1 ? errc::io_error : errc::peer_lost), "rank " + std::to_string(rank) + " code: " + err);
        test::expect(took < 10s, "the collective failed long before its 30 s timeout");
        bool later_failed = false;
        try {
          pg.allreduce(t).wait(20s);
        } catch (const error&) {
          later_failed = true;
        }
        test::expect(later_failed, "the group is broken afterwards");
      },
      opts, 120s));
}

TEST_CASE("a payload delayed below the timeout changes no bit and the peers name the late rank", "[ddp][fault]") {
  const auto kind = GENERATE(ddp::transport_kind::shared_memory, ddp::transport_kind::tcp);
  INFO(name_of(kind));
  constexpr auto delay = 1500ms;
  auto opts = faulted("seed 3\nrule collective:allreduce:rank=1:bucket=0 delay=1500\nrule collective:allreduce reorder=40\n", kind);
  opts.blame_after = 500ms;
  // Each rank's blame lines; the report is made on the group's watch thread.
  struct lines {
    std::mutex mu;
    std::vector<std::string> seen;
  };
  auto blamed = std::make_shared<lines>();
  opts.on_blame = [blamed](const std::string& s) {
    std::lock_guard<std::mutex> lock(blamed->mu);
    blamed->seen.push_back(s);
  };
  REQUIRE(test::run_group(
      3,
      [blamed, delay](int rank, const ddp::file_store&, ddp::process_group& pg) {
        tensor plain = input_of(rank);
        pg.allreduce(plain).wait(20s);  // #1: no bucket, reorder only
        tensor late = input_of(rank);
        pg.note_next("bucket 0");
        const auto start = std::chrono::steady_clock::now();
        pg.allreduce(late).wait(20s);  // #2: rank 1 enters it 1.5 s late
        const auto took = std::chrono::steady_clock::now() - start;
        test::expect(same_bits(plain, late), "rank " + std::to_string(rank) + ": the delayed allreduce gives the same bits");
        test::expect(took >= delay - 100ms, "every rank waited for the late payload");
        if (rank == 1) return;
        std::lock_guard<std::mutex> lock(blamed->mu);
        bool named = false;
        for (const auto& s : blamed->seen) named = named || has(s, "rank 1 never entered allreduce #2 (bucket 0)");
        test::expect(named, "rank " + std::to_string(rank) + " named rank 1 in a hang report (" + std::to_string(blamed->seen.size()) +
                                " reports" + (blamed->seen.empty() ? std::string() : ", first '" + blamed->seen.front() + "'") + ")");
      },
      opts, 120s));
}

TEST_CASE("a duplicated payload is dropped by its sequence number and changes no bit", "[ddp][fault]") {
  const auto kind = GENERATE(ddp::transport_kind::shared_memory, ddp::transport_kind::tcp);
  INFO(name_of(kind));
  ddp::process_group_options opts;
  opts.transport = kind;
  opts.timeout = 30s;
  auto inj = std::make_shared<fault_injector>(
      fault_plan::parse("rule collective:allreduce:rank=1 duplicate=1\nrule collective:send:rank=0 duplicate=1\n"));
  opts.payload_faults = [inj](envelope& m) { return inj->on_send(m); };
  opts.recorder = std::make_shared<flight_recorder>(64);
  REQUIRE(test::run_group(
      3,
      [inj, rec = opts.recorder, tcp = kind == ddp::transport_kind::tcp](int rank, const ddp::file_store&, ddp::process_group& pg) {
        const std::string who = "rank " + std::to_string(rank);
        for (int n = 0; n < 3; ++n) {
          // Multiples of 1/8 below 2^20: every sum is exact, so the bits are known.
          tensor t = zeros({4099});
          auto* p = t.data<float>();
          for (int i = 0; i < 4099; ++i) p[i] = 0.125f * static_cast<float>((rank + 1) * (i % 97) + n);
          pg.allreduce(t).wait(20s);
          bool exact = true;
          for (int i = 0; i < 4099; ++i) exact = exact && p[i] == 0.125f * static_cast<float>(6 * (i % 97) + 3 * n);
          test::expect(exact, who + ": allreduce " + std::to_string(n) + " gives the exact sum once");
        }
        if (rank < 2) {  // two sends 0 -> 1: a repeat of the first must not pass for the second
          for (int n = 1; n <= 2; ++n) {
            tensor m = full({64}, static_cast<float>(rank == 0 ? n : -1));
            (rank == 0 ? pg.send(m, 1) : pg.recv(m, 0)).wait(20s);
            test::expect(m.data<float>()[63] == static_cast<float>(n), who + ": message " + std::to_string(n) + " arrives once");
          }
        }
        pg.barrier().wait(20s);  // TCP: rank 2 reads rank 1's late repeat of allreduce #3 here
        int repeats = 0, discarded = 0;
        for (const auto& e : rec->last()) {
          repeats += e.name == "allreduce repeat" || e.name == "send repeat";
          discarded += e.name == "repeat discarded";
        }
        const auto sent_twice = static_cast<int>(inj->counters().duplicated);
        test::expect(sent_twice == (rank == 0 ? 2 : rank == 1 ? 3 : 0), who + " sent " + std::to_string(sent_twice) + " payloads twice");
        test::expect(repeats == sent_twice, who + " recorded " + std::to_string(repeats) + " repeats");
        if (tcp && rank == 2) test::expect(discarded == 3, who + " recorded " + std::to_string(discarded) + " discarded repeats");
        if (!tcp) test::expect(discarded == 0, who + ": shared memory drops nothing on arrival");
      },
      opts, 120s));
}

TEST_CASE("a dropped send fails the send and the matching recv at once", "[ddp][fault]") {
  const auto kind = GENERATE(ddp::transport_kind::shared_memory, ddp::transport_kind::tcp);
  INFO(name_of(kind));
  const auto opts = faulted("rule collective:send:rank=0 fail_first=1\n", kind);
  REQUIRE(test::run_group(
      2,
      [](int rank, const ddp::file_store&, ddp::process_group& pg) {
        tensor t = ones({64});
        const auto start = std::chrono::steady_clock::now();
        std::string err;
        try {
          (rank == 0 ? pg.send(t, 1) : pg.recv(t, 0)).wait(40s);
        } catch (const error& e) {
          err = e.message();
        }
        test::expect(has(err, "the fault plan dropped rank 0's payload of send #1"), "rank " + std::to_string(rank) + ": '" + err + "'");
        test::expect(std::chrono::steady_clock::now() - start < 10s, "failed long before the 30 s timeout");
      },
      opts, 90s));
}

TEST_CASE("payload faults reach the parts of a hierarchical group: a drop fails every rank at once, a delay changes no bit", "[ddp][fault]") {
  const std::uint16_t port = troupe::test::free_port();
  auto ctx = spawn(3, [port](int rank) {
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", "3", 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    ::setenv("TROUPE_JOB_TOKEN", "hierarchical-fault-token", 1);
    ddp::env_process_group dist("hierfault", {});
    const std::string who = "rank " + std::to_string(rank);
    // One host: an allreduce is a reduce to local rank 0 (#1, #3, #5) and a broadcast (#2, #4),
    // both on the shared-memory part "hf-l0". Rank 1 enters reduce #3 late and loses #5.
    ddp::process_group_options po = faulted("rule collective:reduce:seq=3:rank=1 delay=300\nrule collective:reduce:seq=5:rank=1 drop=1\n",
                                            ddp::transport_kind::automatic);
    {
      ddp::hierarchical_group hg(dist.node().store(), rank, 3, "hf", po);
      tensor plain = input_of(rank);
      hg.allreduce(plain).wait(20s);
      tensor t = input_of(rank);
      const auto start = std::chrono::steady_clock::now();
      hg.allreduce(t).wait(20s);
      test::expect(std::chrono::steady_clock::now() - start >= 250ms, who + " waited for the late rank 1");
      test::expect(same_bits(plain, t), who + ": the delayed allreduce gives the same bits");
      std::string err;
      errc code = errc::ok;
      const auto lost_at = std::chrono::steady_clock::now();
      try {
        hg.allreduce(t).wait(40s);
      } catch (const error& e) {
        err = e.message();
        code = e.code();
      }
      test::expect(has(err, "the fault plan dropped rank 1's payload of reduce #5 in process_group 'hf-l0'"), who + ": '" + err + "'");
      test::expect(code == (rank == 1 ? errc::io_error : errc::peer_lost), who + " code: " + err);
      test::expect(std::chrono::steady_clock::now() - lost_at < 10s, who + " failed long before the 30 s timeout");
    }
    dist.shutdown(20s);
  });
  REQUIRE(ctx.join(90s));
}

TEST_CASE("the fault plan of TROUPE_FAULTS reaches the payloads of an env_process_group", "[ddp][fault]") {
  const std::string plan = "/tmp/troupe_collective_plan_" + std::to_string(::getpid()) + ".txt";
  {
    std::FILE* f = std::fopen(plan.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fputs("seed 5\nrule collective:allreduce:seq=2:rank=1 drop=1\n", f);
    std::fclose(f);
  }
  const std::uint16_t port = troupe::test::free_port();
  auto ctx = spawn(2, [port, plan](int rank) {
    ::setenv("RANK", std::to_string(rank).c_str(), 1);
    ::setenv("WORLD_SIZE", "2", 1);
    ::setenv("MASTER_ADDR", "127.0.0.1", 1);
    ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
    ::setenv("TROUPE_JOB_TOKEN", "collective-fault-token", 1);
    ::setenv("TROUPE_FAULTS", plan.c_str(), 1);
    ddp::process_group_options po;
    po.timeout = 30s;
    ddp::env_process_group dist("envfault", po);
    tensor t = ones({16});
    dist.group().allreduce(t).wait(20s);  // #1 passes
    std::string err;
    try {
      dist.group().allreduce(t).wait(40s);
    } catch (const error& e) {
      err = e.message();
    }
    test::expect(has(err, "the fault plan dropped rank 1's payload of allreduce #2"), "rank " + std::to_string(rank) + ": '" + err + "'");
    dist.shutdown(20s);
  });
  const bool joined = ctx.join(90s);
  std::remove(plan.c_str());
  REQUIRE(joined);
}
