// The NCCL process group. Without a device (or without NCCL) only the failure paths run. The
// [cuda] tests run world size 1 on cuda:0 against CPU references, and skip cleanly without a
// device. That is a real run of bootstrap, streams, events, launches and completion polling.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "troupe/actors/fault_plan.hpp"
#include "troupe/actors/flight_recorder.hpp"
#include "troupe/ddp/file_store.hpp"
#include "troupe/ddp/nccl_process_group.hpp"
#include "troupe/tensors/cuda.hpp"
#include "troupe/tensors/factories.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using ddp::reduce_op;

namespace {

bool no_cuda() {
  if (ddp::nccl_compiled() && cuda::device_count() > 0) return false;
  WARN("no CUDA device or no NCCL in this build: skipped");
  return true;
}

/// A fresh rendezvous directory, removed at scope exit.
struct temp_store {
  ddp::file_store fs = ddp::file_store::make_temp();
  temp_store() = default;
  temp_store(const temp_store&) = delete;
  temp_store& operator=(const temp_store&) = delete;
  ~temp_store() { fs.remove_dir(); }
};

ddp::process_group_options quick() {
  ddp::process_group_options o;
  o.timeout = 30s;
  return o;
}

// Small integers, exact in every dtype (bool: 0/1, uint8: non-negative).
double value_of(std::int64_t i, dtype dt) {
  if (dt == dtype::boolean) return static_cast<double>(i % 3 == 0);
  if (dt == dtype::uint8) return static_cast<double>((i * 7) % 11);
  return static_cast<double>((i * 7) % 9 - 4);
}

tensor make_host(std::int64_t n, dtype dt, std::int64_t offset = 0) {
  tensor d = empty({n}, {dtype::float64});
  for (std::int64_t i = 0; i < n; ++i) d.data<double>()[i] = value_of(i + offset, dt);
  return d.to(dt);
}

std::vector<double> host_values(const tensor& t) {
  const tensor d = t.cpu().to(dtype::float64).contiguous();
  return {d.data<double>(), d.data<double>() + d.numel()};
}

const std::vector<dtype> all_dtypes{dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16,
                                    dtype::int32,   dtype::int64,   dtype::uint8,   dtype::boolean};

}  // namespace

TEST_CASE("constructing an nccl process group on a device that is not there throws a clear error at once", "[ddp][nccl]") {
  temp_store st;
  const errc expected = ddp::nccl_compiled() ? errc::device_mismatch : errc::not_supported;
  const auto start = std::chrono::steady_clock::now();
  for (const device d : {cuda_device(cuda::device_count()), cpu_device}) {
    try {
      ddp::nccl_process_group pg(st.fs, 0, 1, "absent", d, quick());
      FAIL("constructed a group on " << to_string(d));
    } catch (const troupe::error& e) {
      CHECK(e.code() == expected);
      CHECK_THAT(e.message(), Catch::Contains("nccl_process_group 'absent'"));
    }
  }
  // Nothing waited on the store or the network: far below the 30 s rendezvous timeout.
  CHECK(std::chrono::steady_clock::now() - start < 10s);
}

TEST_CASE("an nccl process group refuses a rank outside the world before touching the device", "[ddp][nccl]") {
  temp_store st;
  try {
    ddp::nccl_process_group pg(st.fs, 2, 2, "ranks", cuda_device(0), quick());
    FAIL("constructed rank 2 of 2");
  } catch (const troupe::error& e) {
    CHECK(e.code() == (ddp::nccl_compiled() ? errc::bad_argument : errc::not_supported));
  }
}

TEST_CASE("an empty nccl work says so instead of blocking", "[ddp][nccl]") {
  ddp::nccl_work w;
  CHECK_FALSE(w.valid());
  CHECK_FALSE(w.is_completed());
  CHECK_FALSE(w.error().has_value());
  try {
    w.wait(1ms);
    FAIL("waited on an empty work");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::invalid_state);
  }
}

TEST_CASE("allreduce on one rank gives the CPU reference for every dtype and op", "[ddp][nccl][cuda]") {
  if (no_cuda()) return;
  temp_store st;
  ddp::nccl_process_group pg(st.fs, 0, 1, "allreduce", cuda_device(0), quick());
  CHECK(pg.world_size() == 1);
  for (const dtype dt : all_dtypes) {
    for (const reduce_op op : {reduce_op::sum, reduce_op::avg, reduce_op::min, reduce_op::max, reduce_op::product}) {
      INFO(to_string(dt) << " " << to_string(op));
      const tensor host = make_host(1000, dt);
      tensor dev = host.to(cuda_device(0));
      auto w = pg.allreduce(dev, op);
      w.wait(30s);
      CHECK(w.is_completed());
      CHECK_FALSE(w.error().has_value());
      CHECK(host_values(dev) == host_values(host));  // op over one rank is the identity
    }
  }
  CHECK_FALSE(pg.failure().has_value());
}

TEST_CASE("broadcast, allgather and reduce_scatter on one rank match the CPU reference", "[ddp][nccl][cuda]") {
  if (no_cuda()) return;
  temp_store st;
  ddp::nccl_process_group pg(st.fs, 0, 1, "colls", cuda_device(0), quick());
  for (const dtype dt : all_dtypes) {
    INFO(to_string(dt));
    const tensor host = make_host(513, dt);
    tensor b = host.to(cuda_device(0));
    pg.broadcast(b, 0).wait(30s);
    CHECK(host_values(b) == host_values(host));

    tensor gathered = zeros({513}, {dt, cuda_device(0)});
    pg.allgather(gathered, host.to(cuda_device(0))).wait(30s);
    CHECK(host_values(gathered) == host_values(host));

    tensor scattered = zeros({513}, {dt, cuda_device(0)});
    pg.reduce_scatter(scattered, host.to(cuda_device(0)), reduce_op::sum).wait(30s);
    CHECK(host_values(scattered) == host_values(host));
  }
  auto bw = pg.barrier();
  bw.wait(30s);
  CHECK(bw.is_completed());
}

TEST_CASE("a batch of a send and a receive to self moves the bytes; a lone send to self is refused", "[ddp][nccl][cuda]") {
  if (no_cuda()) return;
  temp_store st;
  ddp::nccl_process_group pg(st.fs, 0, 1, "p2p", cuda_device(0), quick());
  const tensor host = make_host(4097, dtype::float32);
  tensor out = zeros({4097}, {dtype::float32, cuda_device(0)});
  pg.batch_p2p({ddp::p2p_op::send(host.to(cuda_device(0)), 0), ddp::p2p_op::recv(out, 0)}).wait(30s);
  CHECK(host_values(out) == host_values(host));
  try {
    pg.send(out, 0);
    FAIL("a lone send to self was accepted");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::bad_argument);
  }
}

TEST_CASE("nccl collectives refuse tensors on the wrong device or of the wrong size before launching", "[ddp][nccl][cuda]") {
  if (no_cuda()) return;
  temp_store st;
  ddp::nccl_process_group pg(st.fs, 0, 1, "checks", cuda_device(0), quick());
  auto code_of = [](auto&& f) {
    try {
      f();
    } catch (const troupe::error& e) {
      return e.code();
    }
    return errc::ok;
  };
  CHECK(code_of([&] { pg.allreduce(ones({4})); }) == errc::device_mismatch);
  if (cuda::device_count() > 1) CHECK(code_of([&] { pg.allreduce(ones({4}, {dtype::float32, cuda_device(1)})); }) == errc::device_mismatch);
  const tensor g = ones({4}, {dtype::float32, cuda_device(0)});
  CHECK(code_of([&] { pg.allgather(zeros({5}, {dtype::float32, cuda_device(0)}), g); }) == errc::shape_mismatch);
  CHECK(code_of([&] { pg.allgather(zeros({4}, {dtype::float64, cuda_device(0)}), g); }) == errc::dtype_mismatch);
  CHECK(code_of([&] { pg.broadcast(g, 1); }) == errc::bad_argument);
  CHECK(code_of([&] { pg.allreduce(tensor{}); }) == errc::bad_argument);
  // The refusals left the group healthy.
  CHECK_FALSE(pg.failure().has_value());
  pg.allreduce(g).wait(30s);
}

#if defined(TROUPE_WITH_CUDA)  // cuda::stream exists only in CUDA builds
TEST_CASE("an nccl collective runs after the caller's stream work and before what the caller orders after it", "[ddp][nccl][cuda]") {
  if (no_cuda()) return;
  temp_store st;
  ddp::nccl_process_group pg(st.fs, 0, 1, "order", cuda_device(0), quick());
  cuda::stream s(0);
  cuda::stream_guard guard(s);
  const std::int64_t n = std::int64_t{1} << 24;
  tensor out = zeros({n}, {dtype::float32, cuda_device(0)});
  tensor in = full({n}, 3.0, {dtype::float32, cuda_device(0)});  // enqueued on s
  auto w = pg.reduce_scatter(out, in);  // the NCCL stream waits on s
  w.synchronize_stream();              // s waits on the NCCL stream; the host does not block
  const auto v = host_values(out);     // the copy runs on s
  CHECK(std::count(v.begin(), v.end(), 3.0) == n);
  w.wait(30s);
}
#endif

TEST_CASE("a huge allreduce waited with a tiny deadline completes or times out and kills the group cleanly", "[ddp][nccl][cuda]") {
  if (no_cuda()) return;
  temp_store st;
  ddp::nccl_process_group pg(st.fs, 0, 1, "abort", cuda_device(0), quick());
  tensor t = ones({std::int64_t{1} << 28}, {dtype::float32, cuda_device(0)});  // 1 GiB
  auto w = pg.allreduce(t);
  try {
    w.wait(0ms);
    CHECK_FALSE(pg.failure().has_value());
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::timeout);
    REQUIRE(pg.failure().has_value());
    CHECK(pg.failure()->code() == errc::timeout);
    CHECK(w.is_completed());
    CHECK(w.error()->code() == errc::timeout);
    try {
      pg.allreduce(t);
      FAIL("a collective ran on an aborted communicator");
    } catch (const troupe::error& later) {
      CHECK(later.code() == errc::invalid_state);
      CHECK_THAT(later.message(), Catch::Contains("did not complete within 0 ms"));
    }
  }
}

TEST_CASE("a user abort makes later nccl collectives fail with invalid_state naming the reason", "[ddp][nccl][cuda]") {
  if (no_cuda()) return;
  temp_store st;
  ddp::nccl_process_group pg(st.fs, 0, 1, "userabort", cuda_device(0), quick());
  tensor t = ones({16}, {dtype::float32, cuda_device(0)});
  pg.allreduce(t).wait(30s);
  pg.abort("test teardown");
  pg.abort("twice is harmless");
  try {
    pg.barrier();
    FAIL("a barrier ran on an aborted communicator");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::invalid_state);
    CHECK_THAT(e.message(), Catch::Contains("test teardown"));
  }
}

TEST_CASE("nccl collectives are recorded in the flight recorder with the note of note_next", "[ddp][nccl][cuda]") {
  if (no_cuda()) return;
  temp_store st;
  auto opts = quick();
  opts.recorder = std::make_shared<flight_recorder>(16);
  ddp::nccl_process_group pg(st.fs, 0, 1, "recorded", cuda_device(0), opts);
  tensor t = ones({256}, {dtype::float32, cuda_device(0)});
  pg.note_next("bucket 3");
  auto w = pg.allreduce(t);
  CHECK_THAT(w.description(), Catch::Contains("bucket 3"));
  w.wait(30s);
  pg.broadcast(t, 0).wait(30s);
  const auto entries = opts.recorder->last();
  REQUIRE(entries.size() == 2);
  CHECK(entries[0].kind == trace_kind::collective);
  CHECK_THAT(entries[0].name, Catch::StartsWith("allreduce"));
  CHECK(entries[0].detail == "bucket 3");
  CHECK(entries[0].seq == 1);
  CHECK(entries[0].ended.has_value());
  CHECK(entries[0].ok);
  CHECK_THAT(entries[1].name, Catch::StartsWith("broadcast"));
  CHECK(entries[1].seq == 2);
  CHECK(entries[1].detail.find("bucket") == std::string::npos);  // a note names one collective only
}

namespace {

/// Options whose payloads pass through `plan` (Note [collective payload faults]).
ddp::process_group_options faulted_nccl(const std::string& plan) {
  auto o = quick();
  auto inj = std::make_shared<fault_injector>(fault_plan::parse(plan));
  o.payload_faults = [inj](envelope& m) { return inj->on_send(m); };
  return o;
}

}  // namespace

TEST_CASE("a payload the fault plan drops fails the nccl collective with io_error naming it and breaks the group", "[ddp][nccl][cuda][fault]") {
  if (no_cuda()) return;
  temp_store st;
  ddp::nccl_process_group pg(st.fs, 0, 1, "ncclfault", cuda_device(0), faulted_nccl("rule collective:allreduce:seq=2 drop=1\n"));
  tensor t = full({64}, 3.0, {dtype::float32, cuda_device(0)});
  pg.allreduce(t).wait(30s);  // #1 passes
  CHECK(host_values(t) == std::vector<double>(64, 3.0));
  std::string err;
  errc code = errc::ok;
  try {
    pg.allreduce(t).wait(30s);
  } catch (const troupe::error& e) {
    err = e.message();
    code = e.code();
  }
  CHECK(code == errc::io_error);
  CHECK_THAT(err, Catch::Contains("the fault plan dropped rank 0's payload of allreduce #2"));
  CHECK_THROWS(pg.broadcast(t, 0).wait(30s));  // the communicator was aborted
  REQUIRE(pg.failure().has_value());
}

TEST_CASE("a payload the fault plan delays enters the nccl collective late with the same result", "[ddp][nccl][cuda][fault]") {
  if (no_cuda()) return;
  temp_store st;
  ddp::nccl_process_group pg(st.fs, 0, 1, "nccldelay", cuda_device(0),
                             faulted_nccl("rule collective:broadcast delay=400\nrule collective:allreduce:seq=9 drop=1\n"));
  tensor t = make_host(1000, dtype::float32).to(cuda_device(0));
  const auto start = std::chrono::steady_clock::now();
  pg.allreduce(t).wait(30s);  // #1: neither rule matches
  pg.broadcast(t, 0).wait(30s);  // #2: entered 400 ms late
  CHECK(std::chrono::steady_clock::now() - start >= 350ms);
  CHECK(host_values(t) == host_values(make_host(1000, dtype::float32)));
  CHECK_FALSE(pg.failure().has_value());
}
