// RPC device maps (Note [rpc device map]): validation at set time, refusal of unmapped CUDA
// devices at call time, the wire form of a mapped tensor, and ([cuda]) a real transfer.
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
  n.shutdown(shutdown_mode::graceful, 2s);
}
