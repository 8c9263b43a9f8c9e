// The CPU process group against float64 references, on 1-4 spawned ranks.
#include <signal.h>
#include <sys/mman.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "ddp/ddp_harness.hpp"
#include "integration/node_harness.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/tensors/factories.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using ddp::reduce_op;

namespace {

// Small integers: exact in every dtype and under every reduction for up to 4 ranks.
double value_of(int rank, std::int64_t i, dtype dt) {
  if (dt == dtype::boolean) return static_cast<double>((i + rank) % 3 == 0);
  if (dt == dtype::uint8) return static_cast<double>((i * 7 + rank * 5) % 3 + 1);
  return static_cast<double>((i * 7 + rank * 13) % 9 - 4 + (i % 5 == 0 ? 0 : 1));
}

tensor make_input(int rank, std::int64_t n, dtype dt) {
  tensor d = empty({n}, {dtype::float64});
  auto* p = d.data<double>();
  for (std::int64_t i = 0; i < n; ++i) p[i] = value_of(rank, i, dt);
  return d.to(dt);
}

double reduce_ref(reduce_op op, int world, std::int64_t i, dtype dt) {
  double acc = value_of(0, i, dt);
  for (int k = 1; k < world; ++k) {
    const double v = value_of(k, i, dt);
    switch (op) {
      case reduce_op::sum: case reduce_op::avg: acc += v; break;
      case reduce_op::product: acc *= v; break;
      case reduce_op::min: acc = std::min(acc, v); break;
      case reduce_op::max: acc = std::max(acc, v); break;
    }
  }
  if (dt == dtype::boolean) return acc != 0 ? 1 : 0;
  if (op == reduce_op::avg) acc = is_floating(dt) ? acc / world : std::trunc(acc / world);
  return acc;
}

double tolerance(dtype dt) {
  switch (dt) {
    case dtype::float16: return 1e-3;
    case dtype::bfloat16: return 1e-2;
    case dtype::float32: return 1e-6;
    default: return 1e-12;
  }
}

void expect_close(const tensor& got, const std::function<double(std::int64_t)>& ref, const std::string& what) {
  const tensor d = got.to(dtype::float64);
  const double* p = d.data<double>();
  for (std::int64_t i = 0; i < d.numel(); ++i) {
    const double r = ref(i);
    if (std::abs(p[i] - r) > tolerance(got.dtype()) * std::max(1.0, std::abs(r)))
      test::expect(false, what + ": element " + std::to_string(i) + " is " + std::to_string(p[i]) + ", expected " +
                              std::to_string(r));
  }
}

void check_all_collectives(int rank, ddp::process_group& pg, std::int64_t n, dtype dt) {
  const int w = pg.world_size();
  const std::string tag = std::string(to_string(dt)) + " n=" + std::to_string(n) + " w=" + std::to_string(w);
  for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::min, reduce_op::max, reduce_op::product}) {
    tensor t = make_input(rank, n, dt);
    pg.allreduce(t, op).wait(20s);
    expect_close(t, [&](std::int64_t i) { return reduce_ref(op, w, i, dt); }, "allreduce " + std::string(ddp::to_string(op)) + " " + tag);
  }
  const int root = w - 1;
  tensor b = make_input(rank, n, dt);
  pg.broadcast(b, root).wait(20s);
  expect_close(b, [&](std::int64_t i) { return value_of(root, i, dt); }, "broadcast " + tag);
  tensor in = make_input(rank, n, dt);
  tensor out = zeros({n * w}, {dt});
  pg.allgather(out, in).wait(20s);
  expect_close(out, [&](std::int64_t i) { return value_of(static_cast<int>(i / n), i % n, dt); }, "allgather " + tag);
  tensor rs_in = make_input(rank, n * w, dt);
  tensor rs_out = zeros({n}, {dt});
  pg.reduce_scatter(rs_out, rs_in, reduce_op::sum).wait(20s);
  expect_close(rs_out, [&](std::int64_t i) { return reduce_ref(reduce_op::sum, w, rank * n + i, dt); }, "reduce_scatter " + tag);
  pg.barrier().wait(20s);
}

}  // namespace

TEST_CASE("every CPU collective matches its reference for every dtype on 1 to 4 ranks", "[ddp][process_group]") {
  const int world = GENERATE(1, 2, 3, 4);
  ddp::process_group_options opts;
  opts.slot_bytes = 64 << 10;  // small slots: several pipelined chunks even for small tensors
  REQUIRE(test::run_group(world, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    for (dtype dt : {dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16, dtype::int32, dtype::int64,
                     dtype::uint8, dtype::boolean})
      for (std::int64_t n : {0, 1, 7, 1000})
        check_all_collectives(rank, pg, n, dt);
    for (std::int64_t n : {std::int64_t{40'000}, std::int64_t{100'003}})  // several chunks, odd shards
      check_all_collectives(rank, pg, n, dtype::float32);
  }, opts));
}

TEST_CASE("allreduce of tensors in the shared arena works in place, bitwise equal to the copying path, on 1 to 4 ranks",
          "[ddp][process_group]") {
  const int world = GENERATE(1, 2, 3, 4);
  REQUIRE(test::run_group(world, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    const int w = pg.world_size();
    for (dtype dt : {dtype::float32, dtype::float64, dtype::float16, dtype::int32})
      for (std::int64_t n : {1, 7, 1000, 100'003, 300'001})  // the last: several 256 KiB pieces per shard
        for (reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::max}) {
          const std::string what = "shared " + std::string(to_string(dt)) + " n=" + std::to_string(n) + " " + ddp::to_string(op);
          tensor t = pg.empty_shared({n}, dt);
          test::expect(pg.is_shared(t) && t.is_contiguous() && t.abs().sum().item() == 0.0, what + ": a zeroed arena tensor");
          t.copy_(make_input(rank, n, dt));
          tensor plain = make_input(rank, n, dt);
          pg.allreduce(t, op).wait(20s);
          pg.allreduce(plain, op).wait(20s);  // the slot path, interleaved: the counters stay aligned
          expect_close(t, [&](std::int64_t i) { return reduce_ref(op, w, i, dt); }, what);
          test::expect(std::memcmp(t.data_ptr(), plain.data_ptr(), t.nbytes()) == 0, what + ": same bits as the copying path");
        }
    // A contiguous view into a shared tensor is shared too; a rank whose tensor is ordinary makes
    // every rank take the copying path.
    tensor big = pg.empty_shared({5000}, dtype::float64);
    tensor view = big.narrow(0, 1000, 3000);
    view.copy_(make_input(rank, 3000, dtype::float64));
    test::expect(pg.is_shared(view), "a view of a shared tensor is shared");
    pg.allreduce(view).wait(20s);
    expect_close(view, [&](std::int64_t i) { return reduce_ref(reduce_op::sum, w, i, dtype::float64); }, "shared view");
    test::expect(big.narrow(0, 0, 1000).abs().sum().item() == 0.0, "bytes outside the view untouched");
    tensor mixed = rank == 0 ? pg.empty_shared({777}, dtype::float32) : empty({777});
    mixed.copy_(make_input(rank, 777, dtype::float32));
    pg.allreduce(mixed).wait(20s);
    expect_close(mixed, [&](std::int64_t i) { return reduce_ref(reduce_op::sum, w, i, dtype::float32); }, "mixed");
  }));
}

TEST_CASE("the shared arena falls back to ordinary tensors when full and reuses freed ranges", "[ddp][process_group]") {
  ddp::process_group_options opts;
  opts.shared_arena_bytes = 1 << 20;
  REQUIRE(test::run_group(2, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    tensor too_big = pg.empty_shared({300'000});  // 1.2 MB > 1 MiB arena
    test::expect(too_big.defined() && !pg.is_shared(too_big) && too_big.numel() == 300'000, "too large: an ordinary tensor");
    {
      tensor a = pg.empty_shared({150'000});  // 600 KB
      test::expect(pg.is_shared(a), "fits");
      tensor b = pg.empty_shared({150'000});
      test::expect(!pg.is_shared(b), "a second 600 KB does not fit beside it");
    }
    tensor c = pg.empty_shared({150'000});
    test::expect(pg.is_shared(c), "the freed range is reused");
    c.fill_(static_cast<double>(rank + 1));
    pg.allreduce(c).wait(20s);
    test::expect(c.data<float>()[149'999] == 3.0f, "allreduce in the reused range");
  }, opts));
  REQUIRE_THROWS_AS(test::run_group(1, [](int, const ddp::file_store&, ddp::process_group& pg) { pg.empty_shared({-1}); }), error);
}

TEST_CASE("every collective matches its reference at 64 MB on 1 to 4 ranks over both transports", "[ddp][process_group]") {
  const int world = GENERATE(1, 2, 3, 4);
  const auto transport = GENERATE(ddp::transport_kind::shared_memory, ddp::transport_kind::tcp);
  INFO("world " << world << ", transport " << static_cast<int>(transport));
  ddp::process_group_options opts;
  opts.transport = transport;
  REQUIRE(test::run_group(world, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    const int w = pg.world_size();
    const std::int64_t n = 16 << 20;  // float32: 64 MB
    tensor t = make_input(rank, n, dtype::float32);
    pg.allreduce(t, reduce_op::sum).wait(60s);
    expect_close(t, [&](std::int64_t i) { return reduce_ref(reduce_op::sum, w, i, dtype::float32); }, "allreduce 64 MB");
    tensor b = make_input(rank, n, dtype::float32);
    pg.broadcast(b, w - 1).wait(60s);
    expect_close(b, [&](std::int64_t i) { return value_of(w - 1, i, dtype::float32); }, "broadcast 64 MB");
    const std::int64_t part = n / w;  // allgather output and reduce_scatter input: 64 MB
    tensor out = zeros({part * w});
    pg.allgather(out, make_input(rank, part, dtype::float32)).wait(60s);
    expect_close(out, [&](std::int64_t i) { return value_of(static_cast<int>(i / part), i % part, dtype::float32); },
                 "allgather to 64 MB");
    tensor rs = zeros({part});
    pg.reduce_scatter(rs, make_input(rank, part * w, dtype::float32), reduce_op::sum).wait(60s);
    expect_close(rs, [&](std::int64_t i) { return reduce_ref(reduce_op::sum, w, rank * part + i, dtype::float32); },
                 "reduce_scatter from 64 MB");
  }, opts, std::chrono::seconds(180)));
}

TEST_CASE("ranks with different arena sizes, or none, form a group and take the copying path", "[ddp][process_group]") {
  test::temp_store dir;
  const ddp::file_store store = dir.store;
  auto ctx = spawn(2, [store](int rank) {
    ddp::process_group_options opts;
    opts.shared_arena_bytes = rank == 0 ? 0 : std::size_t{4} << 20;
    ddp::process_group pg(store, rank, 2, "test", opts);
    tensor t = pg.empty_shared({1000});
    test::expect(pg.is_shared(t) == (rank == 1), "only rank 1 has an arena");
    t.fill_(static_cast<double>(rank + 1));
    pg.allreduce(t).wait(20s);
    test::expect(t.data<float>()[999] == 3.0f, "allreduce with one shared and one ordinary tensor");
  });
  REQUIRE(ctx.join(60s));
}

TEST_CASE("collectives issued back to back complete in issue order", "[ddp][process_group]") {
  REQUIRE(test::run_group(3, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    std::vector<ddp::work> works;
    std::vector<tensor> ts;
    for (int i = 0; i < 12; ++i) {
      ts.push_back(full({1000 + i * 100}, static_cast<double>(rank + i)));
      works.push_back(pg.allreduce(ts.back(), reduce_op::sum));
    }
    works.back().wait(20s);
    for (int i = 0; i < 12; ++i) {
      test::expect(works[i].is_completed() && !works[i].error(), "work " + std::to_string(i) + " completed before the last");
      test::expect(ts[i].data<float>()[0] == static_cast<float>(3 * i + 3), "value of allreduce " + std::to_string(i));
    }
  }));
}

TEST_CASE("a collective whose size differs on one rank fails with collective_mismatch on every rank", "[ddp][process_group]") {
  REQUIRE(test::run_group(3, [](int rank, const ddp::file_store&, ddp::process_group& pg) { test::expect_size_mismatch_reported(rank, pg); }));
}

TEST_CASE("a rank that skips a collective gets collective_mismatch naming the ranks and sequence numbers, and the others do not time out",
          "[ddp][process_group]") {
  const auto transport = GENERATE(ddp::transport_kind::shared_memory, ddp::transport_kind::tcp);
  INFO("transport " << static_cast<int>(transport));
  ddp::process_group_options opts;
  opts.transport = transport;
  opts.timeout = 30s;  // a timeout would take 30 s: the mismatch must come long before
  REQUIRE(test::run_group(3, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    const auto t0 = std::chrono::steady_clock::now();
    tensor a = ones({10}), b = ones({5});
    auto expect_mismatch = [&](ddp::work w, const std::vector<std::string>& parts) {
      try {
        w.wait(20s);
      } catch (const error& e) {
        test::expect(e.code() == errc::collective_mismatch, "collective_mismatch, got " + std::string(e.what()));
        for (const auto& p : parts)
          test::expect(e.message().find(p) != std::string::npos, "message holds '" + p + "': " + e.message());
        return;
      }
      test::expect(false, "rank " + std::to_string(rank) + ": " + w.description() + " should fail");
    };
    const std::vector<std::string> first = {"collective #1 differs", "rank 0 called allreduce(sum) float32 numel 10 #1",
                                            "rank 1 called broadcast(root 0) float32 numel 5 #1"};
    if (rank == 1) {  // skips the allreduce: its #1 is the others' #2
      expect_mismatch(pg.broadcast(b, 0), first);
      return;  // leaves the group
    }
    expect_mismatch(pg.allreduce(a), first);
    expect_mismatch(pg.broadcast(b, 0), {"rank 1 left the group after collective #1 (broadcast(root 0) float32 numel 5 #1)",
                                         "broadcast #2", "different numbers of collectives"});
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    test::expect(ms < 5000, "both errors within 5 s, took " + std::to_string(ms) + " ms");
  }, opts));
}

TEST_CASE("send and recv pass tensors around a ring, also larger than the mailbox", "[ddp][process_group]") {
  ddp::process_group_options opts;
  opts.p2p_bytes = 8192;
  REQUIRE(test::run_group(3, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    const int w = pg.world_size();
    tensor out = make_input(rank, 5000, dtype::float64);
    tensor in = zeros({5000}, {dtype::float64});
    const int src = (rank + w - 1) % w;
    ddp::work s = pg.send(out, (rank + 1) % w, 7);
    // Ranks receive before their send completes: large sends wait for the matching recv.
    ddp::work r = pg.recv(in, src, 7);
    r.wait(20s);
    s.wait(20s);
    expect_close(in, [&](std::int64_t i) { return value_of(src, i, dtype::float64); }, "recv");
  }, opts));
}

TEST_CASE("bad collective arguments are rejected at once", "[ddp][process_group]") {
  REQUIRE(test::run_group(1, [](int, const ddp::file_store&, ddp::process_group& pg) {
    tensor m = ones({4, 4});
    auto expect_code = [](errc code, const std::function<void()>& f) {
      try {
        f();
      } catch (const error& e) {
        test::expect(e.code() == code, "code " + std::string(to_string(code)) + ", got " + e.what());
        return;
      }
      test::expect(false, "no error thrown");
    };
    expect_code(errc::bad_argument, [&] { pg.allreduce(m.t()); });
    expect_code(errc::bad_argument, [&] { pg.broadcast(m, 3); });
    expect_code(errc::shape_mismatch, [&] { pg.allgather(ones({3}), ones({2})); });
    pg.allreduce(m).wait(5s);  // the sequence was not consumed
  }));
}

TEST_CASE("a monitored barrier names the rank that did not arrive", "[ddp][process_group]") {
  REQUIRE(test::run_group(3, [](int rank, const ddp::file_store& st, ddp::process_group& pg) {
    test::expect_late_rank_named(rank, st, pg, "rank(s) 2 did not arrive");
  }));
}

TEST_CASE("a rank killed during an allreduce makes the others fail with peer_lost within 2 s", "[ddp][process_group][fault]") {
  auto probe = std::make_shared<test::peer_loss_probe>();
  test::temp_store dir;
  auto ctx = test::spawn_group(dir, 3, [probe](int rank, const ddp::file_store&, ddp::process_group& pg) {
    pg.barrier().wait(10s);
    tensor t = ones({4 << 20});
    ddp::work w = pg.allreduce(t);
    if (rank == 2) probe->kill_self();
    probe->report(rank, [&] { w.wait(10s); });
  });
  test::check_peer_lost(*probe, 2, 2, "shm allreduce");
  REQUIRE_THROWS_AS(ctx.join(20s), error);
}

TEST_CASE("a process group meets through the runtime node's store", "[ddp][process_group]") {
  auto pipe = std::make_shared<test::port_pipe>();
  auto ctx = spawn(2, [pipe](int rank) {
    std::unique_ptr<node> n;
    if (rank == 0) {
      n = std::make_unique<node>(test::test_options(0, 2, 0));
      pipe->publish(n->port(), 1);
    } else {
      n = std::make_unique<node>(test::test_options(1, 2, pipe->read()));
    }
    {
      ddp::process_group pg(n->store(), rank, 2, "via_node");
      tensor t = full({1000}, static_cast<double>(rank + 1));
      pg.allreduce(t).wait(10s);
      test::expect(t.data<float>()[999] == 3.0f, "allreduce through a node-made group");
    }
    n->shutdown(shutdown_mode::graceful);
  });
  REQUIRE(ctx.join(60s));
}
