// reduce, gather, scatter, all_to_all and subgroups against float64 references, on 1-4 spawned
// ranks over both CPU transports.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>

#include "ddp/ddp_harness.hpp"
#include "troupe/tensors/factories.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using ddp::reduce_op;

namespace {

// Small integers: exact in every dtype and under sum/max for up to 4 ranks.
double value_of(int rank, std::int64_t i, dtype dt) {
  if (dt == dtype::boolean) return static_cast<double>((i + rank) % 3 == 0);
  if (dt == dtype::uint8) return static_cast<double>((i * 7 + rank * 5) % 3 + 1);
  return static_cast<double>((i * 7 + rank * 13) % 9 - 4);
}

tensor make_input(int rank, std::int64_t n, dtype dt) {
  tensor d = empty({n}, {dtype::float64});
  for (std::int64_t i = 0; i < n; ++i) d.data<double>()[i] = value_of(rank, i, dt);
  return d.to(dt);
}

double sum_ref(int world, std::int64_t i, dtype dt) {
  double acc = 0;
  for (int k = 0; k < world; ++k) acc += value_of(k, i, dt);
  return dt == dtype::boolean ? (acc != 0 ? 1 : 0) : acc;
}

double max_ref(int world, std::int64_t i, dtype dt) {
  double acc = value_of(0, i, dt);
  for (int k = 1; k < world; ++k) acc = std::max(acc, value_of(k, i, dt));
  return acc;
}

void expect_equal(const tensor& got, const std::function<double(std::int64_t)>& ref, const std::string& what) {
  const tensor d = got.to(dtype::float64);
  for (std::int64_t i = 0; i < d.numel(); ++i) {
    const double r = ref(i);
    if (std::abs(d.data<double>()[i] - r) > 1e-2 * std::max(1.0, std::abs(r)))
      test::expect(false, what + ": element " + std::to_string(i) + " is " + std::to_string(d.data<double>()[i]) +
                              ", expected " + std::to_string(r));
  }
}

void check_composed(int rank, ddp::process_group& pg, std::int64_t n, dtype dt) {
  const int w = pg.world_size();
  const std::string tag = std::string(to_string(dt)) + " n=" + std::to_string(n) + " w=" + std::to_string(w);
  for (int root = 0; root < w; ++root) {
    tensor t = make_input(rank, n, dt);
    pg.reduce(t, root, reduce_op::sum).wait(20s);
    if (rank == root) expect_equal(t, [&](std::int64_t i) { return sum_ref(w, i, dt); }, "reduce sum " + tag);
    else expect_equal(t, [&](std::int64_t i) { return value_of(rank, i, dt); }, "reduce leaves non-roots " + tag);
  }
  tensor m = make_input(rank, n, dt);
  pg.reduce(m, w - 1, reduce_op::max).wait(20s);
  if (rank == w - 1) expect_equal(m, [&](std::int64_t i) { return max_ref(w, i, dt); }, "reduce max " + tag);

  const int root = w / 2;
  tensor gathered = rank == root ? full({n * w}, 1.0, {dt}) : tensor();
  pg.gather(gathered, make_input(rank, n, dt), root).wait(20s);
  if (rank == root)
    expect_equal(gathered, [&](std::int64_t i) { return value_of(static_cast<int>(i / n), i % n, dt); }, "gather " + tag);

  tensor part = zeros({n}, {dt});
  pg.scatter(part, rank == root ? make_input(root, n * w, dt) : tensor(), root).wait(20s);
  expect_equal(part, [&](std::int64_t i) { return value_of(root, rank * n + i, dt); }, "scatter " + tag);

  // Block j of rank r's input holds value_of(r, j * n + i); block r of rank j's output receives it.
  tensor a2a = zeros({n * w}, {dt});
  pg.all_to_all(a2a, make_input(rank, n * w, dt)).wait(20s);
  expect_equal(a2a, [&](std::int64_t i) { return value_of(static_cast<int>(i / n), rank * n + i % n, dt); },
               "all_to_all " + tag);
}

ddp::process_group_options with(ddp::transport_kind transport) {
  ddp::process_group_options opts;
  opts.transport = transport;
  opts.slot_bytes = 64 << 10;  // several pipelined chunks even for small tensors
  opts.tcp_chunk_bytes = 16 << 10;
  return opts;
}

void expect_code(errc code, const std::function<void()>& f, const std::string& what) {
  try {
    f();
  } catch (const error& e) {
    test::expect(e.code() == code, what + ": code " + std::string(to_string(code)) + ", got " + e.what());
    return;
  }
  test::expect(false, what + ": no error thrown");
}

}  // namespace

TEST_CASE("reduce, gather, scatter and all_to_all match their references on 1 to 4 ranks over both transports",
          "[ddp][process_group]") {
  const int world = GENERATE(1, 2, 3, 4);
  const auto transport = GENERATE(ddp::transport_kind::shared_memory, ddp::transport_kind::tcp);
  INFO("world " << world << ", transport " << static_cast<int>(transport));
  REQUIRE(test::run_group(world, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    for (dtype dt : {dtype::float32, dtype::float64, dtype::bfloat16, dtype::int64, dtype::uint8, dtype::boolean})
      for (std::int64_t n : {0, 1, 7, 1000})
        check_composed(rank, pg, n, dt);
    check_composed(rank, pg, 50'001, dtype::float32);  // several chunks, odd blocks
    tensor t = full({10}, static_cast<double>(rank + 1));
    pg.allreduce(t).wait(20s);  // the primitive collectives stay in step after the composed ones
    test::expect(t.data<float>()[9] == static_cast<float>(pg.world_size() * (pg.world_size() + 1) / 2), "allreduce after");
  }, with(transport)));
}

TEST_CASE("a composed collective that differs on one rank fails with collective_mismatch on every rank, and the group stays usable",
          "[ddp][process_group]") {
  const auto transport = GENERATE(ddp::transport_kind::shared_memory, ddp::transport_kind::tcp);
  INFO("transport " << static_cast<int>(transport));
  ddp::process_group_options opts = with(transport);
  opts.timeout = 30s;  // a timeout would take 30 s: the mismatch must come long before
  REQUIRE(test::run_group(3, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    const auto t0 = std::chrono::steady_clock::now();
    auto expect_mismatch = [&](ddp::work w, const std::string& part) {
      expect_code(errc::collective_mismatch, [&] { w.wait(20s); }, w.description());
      try {
        w.wait(1s);
      } catch (const error& e) {
        test::expect(e.message().find(part) != std::string::npos, "message holds '" + part + "': " + e.message());
      }
    };
    tensor t = ones({10});
    expect_mismatch(pg.reduce(t, rank == 1 ? 2 : 0), "rank 1 called reduce(sum, root 2) float32 numel 10");
    const std::int64_t block = rank == 2 ? 5 : 10;
    expect_mismatch(pg.gather(ones({3 * block}), ones({block}), 2),
                    "rank 2 called gather(root 2) float32 numel 5");
    expect_mismatch(rank == 0 ? pg.scatter(ones({4}), ones({12}), 0) : pg.all_to_all(zeros({12}), ones({12})),
                    "rank 0 called scatter(root 0) float32 numel 4");
    tensor ok = ones({6});
    pg.all_to_all(ok.clone(), ok.clone()).wait(20s);
    pg.reduce(ok, 0).wait(20s);
    if (rank == 0) test::expect(ok.data<float>()[5] == 3.0f, "reduce after the mismatches sums");
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    test::expect(ms < 10000, "the mismatches end within 10 s, took " + std::to_string(ms) + " ms");
  }, opts));
}

TEST_CASE("bad arguments of reduce, gather, scatter and all_to_all are rejected at once", "[ddp][process_group]") {
  REQUIRE(test::run_group(2, [](int rank, const ddp::file_store&, ddp::process_group& pg) {
    expect_code(errc::bad_argument, [&] { pg.reduce(ones({3}), 2); }, "reduce root 2");
    expect_code(errc::bad_argument, [&] { pg.reduce(ones({4, 4}).t(), 0); }, "reduce of a non-contiguous tensor");
    expect_code(errc::bad_argument, [&] { pg.gather(ones({4}), ones({2}), -1); }, "gather root -1");
    if (rank == 0) {
      expect_code(errc::shape_mismatch, [&] { pg.gather(ones({3}), ones({2}), 0); }, "gather output too small on the root");
      expect_code(errc::shape_mismatch, [&] { pg.scatter(ones({2}), ones({4}, {dtype::float64}), 0); }, "scatter dtypes");
      expect_code(errc::bad_argument, [&] { pg.scatter(ones({2}), tensor(), 0); }, "scatter without input on the root");
    }
    expect_code(errc::shape_mismatch, [&] { pg.all_to_all(ones({3}), ones({3})); }, "all_to_all of 3 over 2 ranks");
    expect_code(errc::shape_mismatch, [&] { pg.all_to_all(ones({4}), ones({2})); }, "all_to_all sizes differ");
    tensor t = ones({4});
    pg.reduce(t, 1).wait(10s);  // no sequence number was consumed
    if (rank == 1) test::expect(t.data<float>()[0] == 2.0f, "reduce after the rejected calls");
  }));
}

TEST_CASE("new_group makes subgroups whose collectives involve only their members", "[ddp][process_group]") {
  const auto transport = GENERATE(ddp::transport_kind::shared_memory, ddp::transport_kind::tcp);
  INFO("transport " << static_cast<int>(transport));
  REQUIRE(test::run_group(4, [transport](int rank, const ddp::file_store& st, ddp::process_group& pg) {
    auto even = pg.new_group(st, {2, 0}, with(transport));
    auto odd = pg.new_group(st, {1, 3}, with(transport));
    auto mine = rank % 2 == 0 ? std::move(even) : std::move(odd);
    test::expect(mine.has_value() && mine->world_size() == 2 && mine->rank() == rank / 2, "member of its subgroup, rank by position");
    test::expect(!(rank % 2 == 0 ? odd : even).has_value(), "no group where not a member");
    test::expect(mine->name() == (rank % 2 == 0 ? "test-g1" : "test-g2"), "subgroup name " + mine->name());
    tensor t = full({100}, static_cast<double>(rank));
    mine->allreduce(t).wait(20s);
    test::expect(t.data<float>()[99] == static_cast<float>(rank % 2 == 0 ? 2 : 4), "sum over the subgroup only");
    tensor g = full({2}, -1.0);
    mine->gather(g, full({1}, static_cast<double>(rank)), 0).wait(20s);
    if (mine->rank() == 0) test::expect(g.data<float>()[1] == static_cast<float>(rank + 2), "gather in the subgroup");
    pg.barrier().wait(20s);  // the parent stays usable
  }));
}

TEST_CASE("new_group with different rank lists fails with collective_mismatch on every rank", "[ddp][process_group]") {
  REQUIRE(test::run_group(3, [](int rank, const ddp::file_store& st, ddp::process_group& pg) {
    expect_code(errc::collective_mismatch, [&] { pg.new_group(st, rank == 2 ? std::vector<int>{0, 2} : std::vector<int>{0, 1}); },
                "rank lists differ");
    expect_code(errc::bad_argument, [&] { pg.new_group(st, {0, 0}); }, "duplicate rank");
    expect_code(errc::bad_argument, [&] { pg.new_group(st, {3}); }, "rank outside the group");
    expect_code(errc::bad_argument, [&] { pg.new_group(st, {}); }, "empty list");
    auto all = pg.new_group(st, {0, 1, 2});
    tensor t = ones({3});
    all->allreduce(t).wait(20s);
    test::expect(t.data<float>()[0] == 3.0f, "a group made after the mismatch works");
  }));
}
