// RPC device maps (Note [rpc device map]). The tests cover validation at set time and refusal
// of unmapped CUDA devices at call time. They cover the wire form of a mapped tensor, and
// ([cuda]) a real transfer.
#include <catch2/catch.hpp>

#include <chrono>

#include "troupe/actors/node.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/rpc/codec.hpp"
#include "troupe/actors/rpc/device_map.hpp"
#include "troupe/tensors/cuda.hpp"
#include "troupe/tensors/factories.hpp"

using namespace std::chrono_literals;
using namespace troupe;

namespace {

node_options solo() {
  node_options o;
  o.job_token = "t";
  o.default_timeout = 5s;
  o.join_timeout = 5s;
  return o;
}

errc code_of(const std::function<void()>& fn, std::string* message = nullptr) {
  try {
    fn();
  } catch (const error& e) {
    if (message) *message = e.message();
    return e.code();
  }
  return errc::ok;
}

}  // namespace

TEST_CASE("a device map with a negative index or two devices mapped to one is refused at set time", "[actors][rpc]") {
  rpc::device_maps maps;
  std::string msg;
  CHECK(code_of([&] { maps.set("worker1", {{0, -1}}); }, &msg) == errc::bad_argument);
  CHECK_THAT(msg, Catch::Contains("worker1") && Catch::Contains("cuda:0 -> cuda:-1") && Catch::Contains("negative"));
  CHECK(code_of([&] { maps.set("worker1", {{-2, 0}}); }) == errc::bad_argument);
  CHECK(code_of([&] { maps.set("worker1", {{0, 1}, {1, 1}}); }, &msg) == errc::bad_argument);
  CHECK_THAT(msg, Catch::Contains("cuda:0 and cuda:1 both map to cuda:1"));
  CHECK(maps.of("worker1").empty());  // a refused map changes nothing
  maps.set("worker1", {{0, 1}, {1, 0}});
  CHECK(maps.of("worker1") == rpc::device_map{{0, 1}, {1, 0}});
}

TEST_CASE("a CUDA device without an entry in the peer's device map is refused naming the device and the peer", "[actors][rpc]") {
  rpc::device_maps maps;
  maps.set("worker1", {{0, 3}});
  CHECK(maps.target("worker1", cuda_device(0)) == cuda_device(3));
  std::string msg;
  CHECK(code_of([&] { maps.target("worker1", cuda_device(1)); }, &msg) == errc::device_mismatch);
  CHECK_THAT(msg, Catch::Contains("cuda:1") && Catch::Contains("worker 'worker1'"));
  CHECK(code_of([&] { maps.target("worker2", cuda_device(0)); }, &msg) == errc::device_mismatch);
  CHECK_THAT(msg, Catch::Contains("cuda:0") && Catch::Contains("worker 'worker2'"));
}

TEST_CASE("a node refuses a device map for a worker that is not in the job, at set time and at start", "[actors][rpc][node]") {
  {
    node n(solo());
    std::string msg;
    CHECK(code_of([&] { n.set_device_map("nobody", {{0, 0}}, 2s); }, &msg) == errc::bad_argument);
    CHECK_THAT(msg, Catch::Contains("nobody"));
    CHECK(code_of([&] { n.set_device_map("worker0", {{0, 0}, {1, 0}}, 2s); }) == errc::bad_argument);
    n.set_device_map("worker0", {{0, 0}}, 2s);
    n.shutdown(shutdown_mode::graceful, 2s);
  }
  node_options ghost = solo();
  ghost.device_maps["ghost"] = {{0, 0}};
  std::string msg;
  CHECK(code_of([&] { node n(ghost); }, &msg) == errc::bad_argument);
  CHECK_THAT(msg, Catch::Contains("ghost"));
  node_options negative = solo();
  negative.device_maps["worker0"] = {{0, -1}};
  CHECK(code_of([&] { node n(negative); }) == errc::bad_argument);
}

TEST_CASE("a payload carrying a tensor for a CUDA device this process lacks fails with device_mismatch naming it",
          "[actors][rpc]") {
  const int absent = cuda::device_count();
  std::vector<char> bytes;
  rpc::detail::writer w(bytes);
  w.pod(std::uint8_t{3});  // kind 3: inline bytes for a device
  w.pod(std::uint8_t{1});  // defined
  w.pod(std::int32_t{absent});
  w.pod(static_cast<std::uint8_t>(dtype::float32));
  w.pod(std::uint32_t{1});
  w.pod(std::int64_t{2});
  w.pod(std::uint64_t{8});
  w.pod(std::uint8_t{0});  // no padding
  const float values[2] = {1.f, 2.f};
  w.raw(values, sizeof values);
  rpc::detail::reader r(bytes.data(), bytes.size());
  std::string msg;
  CHECK(code_of([&] { rpc::detail::read_tensor(r); }, &msg) == errc::device_mismatch);
  CHECK_THAT(msg, Catch::Contains("cuda:" + std::to_string(absent)));
}

TEST_CASE("a CUDA argument arrives on the mapped device, and an unmapped one fails the call naming device and peer",
          "[actors][rpc][cuda]") {
  if (cuda::device_count() == 0) {
    WARN("no CUDA device: skipped");
    return;
  }
  node n(solo());
  n.functions().add("where", [](tensor t) {
    return static_cast<std::int64_t>(t.device().is_cuda() ? t.device().index * 1000 + t.sum().item<double>() : -1);
  });
  const tensor x = full({4}, 2.0, {dtype::float32, cuda_device(0)});
  std::string msg;
  CHECK(code_of([&] { rpc_sync<std::int64_t>(n, "worker0", "where", x); }, &msg) == errc::device_mismatch);
  CHECK_THAT(msg, Catch::Contains("cuda:0") && Catch::Contains("worker0"));
  n.set_device_map("worker0", {{0, 0}});
  CHECK(rpc_sync<std::int64_t>(n, "worker0", "where", x) == 8);
  // One process: staged, never by IPC handle. The result comes back on cuda:0 by the reverse map.
  CHECK(n.device_transfers().ipc == 0);
  CHECK(n.device_transfers().staged == 1);
  n.functions().add("twice", [](tensor t) { return t * 2.0; });
  const tensor back = rpc_sync<tensor>(n, "worker0", "twice", x);
  CHECK(back.device() == cuda_device(0));
  CHECK(back.sum().item<double>() == 16.0);
  n.shutdown(shutdown_mode::graceful, 2s);
}

TEST_CASE("a device map inverts one-to-one, and a result device without a reverse entry is refused naming it and the peer",
          "[actors][rpc]") {
  CHECK(rpc::invert_device_map("worker1", {{0, 2}, {1, 0}}) == rpc::device_map{{2, 0}, {0, 1}});
  CHECK(rpc::invert_device_map("worker1", {}).empty());
  std::string msg;
  CHECK(code_of([&] { rpc::invert_device_map("worker1", {{0, 1}, {1, 1}}); }, &msg) == errc::bad_argument);
  CHECK_THAT(msg, Catch::Contains("worker1"));
  const rpc::device_map reverse = rpc::invert_device_map("worker1", {{1, 3}});
  CHECK(rpc::result_device("worker1", reverse, 3) == cuda_device(1));
  CHECK(code_of([&] { rpc::result_device("worker1", reverse, 1); }, &msg) == errc::device_mismatch);
  CHECK_THAT(msg, Catch::Contains("cuda:1") && Catch::Contains("worker 'worker1'"));
}

namespace {
// A kind-4 payload: a float32 result of 2 elements from the sender's cuda:`index`.
std::vector<char> result_payload(std::int32_t index) {
  std::vector<char> bytes;
  rpc::detail::writer w(bytes);
  w.pod(std::uint8_t{4});  // kind 4: a result from a device of the sender
  w.pod(std::uint8_t{1});  // defined
  w.pod(index);
  w.pod(static_cast<std::uint8_t>(dtype::float32));
  w.pod(std::uint32_t{1});
  w.pod(std::int64_t{2});
  w.pod(std::uint64_t{8});
  w.pod(std::uint8_t{0});  // no padding
  const float values[2] = {1.f, 2.f};
  w.raw(values, sizeof values);
  return bytes;
}
}  // namespace

TEST_CASE("a CUDA result comes back by the reverse map only: outside a call or without an entry it fails naming the device",
          "[actors][rpc]") {
  const auto bytes = result_payload(5);
  std::string msg;
  {
    rpc::detail::reader r(bytes.data(), bytes.size());
    CHECK(code_of([&] { rpc::detail::read_tensor(r); }, &msg) == errc::device_mismatch);
    CHECK_THAT(msg, Catch::Contains("cuda:5"));
  }
  const rpc::device_map reverse{{2, 0}};
  const std::string peer = "worker7";
  const rpc::detail::result_devices results(reverse, peer);
  rpc::codec_context ctx;
  ctx.results = &results;
  {
    rpc::detail::reader r(bytes.data(), bytes.size(), ctx);
    CHECK(code_of([&] { rpc::detail::read_tensor(r); }, &msg) == errc::device_mismatch);
    CHECK_THAT(msg, Catch::Contains("cuda:5") && Catch::Contains("worker 'worker7'"));
  }
  if (cuda::device_count() == 0) {  // mapped to cuda:0, which this process lacks
    const auto mapped = result_payload(2);
    rpc::detail::reader r(mapped.data(), mapped.size(), ctx);
    CHECK(code_of([&] { rpc::detail::read_tensor(r); }, &msg) == errc::device_mismatch);
    CHECK_THAT(msg, Catch::Contains("cuda:0"));
  }
}

TEST_CASE("an IPC tensor payload for a device this process lacks, or with a range past its allocation, is refused",
          "[actors][rpc]") {
  const auto payload = [](std::int32_t index, std::uint64_t offset) {
    std::vector<char> bytes;
    rpc::detail::writer w(bytes);
    w.pod(std::uint8_t{5});  // kind 5: an IPC handle
    w.pod(std::uint8_t{1});
    w.pod(index);
    w.pod(static_cast<std::uint8_t>(dtype::float32));
    w.pod(std::uint32_t{1});
    w.pod(std::int64_t{4});
    w.pod(std::uint64_t{16});
    const char handle[64] = {};
    w.raw(handle, sizeof handle);
    w.pod(offset);
    w.pod(std::uint64_t{32});  // the allocation's size
    w.raw(handle, sizeof handle);
    return bytes;
  };
  const auto absent = payload(cuda::device_count(), 0);
  rpc::detail::reader r(absent.data(), absent.size());
  std::string msg;
  CHECK(code_of([&] { rpc::detail::read_tensor(r); }, &msg) == errc::device_mismatch);
  CHECK_THAT(msg, Catch::Contains("cuda:" + std::to_string(cuda::device_count())));
  const auto past = payload(0, 24);  // 16 bytes at 24 of 32
  rpc::detail::reader p(past.data(), past.size());
  CHECK(code_of([&] { rpc::detail::read_tensor(p); }, &msg) == errc::protocol_violation);
  CHECK_THAT(msg, Catch::Contains("offset 24"));
  std::vector<char> unknown{6, 1};
  rpc::detail::reader u(unknown.data(), unknown.size());
  CHECK(code_of([&] { rpc::detail::read_tensor(u); }) == errc::protocol_violation);
}

TEST_CASE("a node counts no CUDA transfers before it sends a CUDA argument", "[actors][rpc][node]") {
  node n(solo());
  CHECK(n.device_transfers().ipc == 0);
  CHECK(n.device_transfers().staged == 0);
  n.shutdown(shutdown_mode::graceful, 2s);
}
