// CUDA tensors between two processes of one host (Note [rpc device map]). Arguments go by CUDA
// IPC handle, bit-exact. Results come back on the caller's device by the reverse map. A result
// on a device without a reverse entry fails naming it. Needs a GPU: skips visibly without.
#include <unistd.h>

#include <cstring>
#include <string>

#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/tensors/cuda.hpp"
#include "troupe/tensors/factories.hpp"

using namespace std::chrono_literals;
using namespace troupe;

namespace {

// Whether the machine has an NVIDIA device node: checked before fork without initialising CUDA
// (a child forked after the parent initialised CUDA cannot use it).
bool gpu_device_files() { return ::access("/dev/nvidiactl", F_OK) == 0; }

// What the callee keeps between calls (one per child process).
tensor& kept() {
  static tensor t;
  return t;
}

bool same_bytes_cpu(const tensor& a, const tensor& b) {
  const tensor x = a.cpu().contiguous(), y = b.cpu().contiguous();
  return x.nbytes() == y.nbytes() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

void serve(std::uint16_t port) {
  node n(test::test_options(1, 2, port));
  n.functions().add("echo", [](tensor t) { return t; });
  n.functions().add("device_of", [](tensor t) { return t.device().is_cuda() ? t.device().index : -1; });
  n.functions().add("keep", [](tensor t) {
    kept() = t;
    return t.device().is_cuda();
  });
  n.functions().add("kept_equals", [](tensor expected) { return same_bytes_cpu(kept(), expected); });
  n.functions().add("make_on", [](int d) { return full({8}, 3.0, {dtype::float32, cuda_device(d)}); });
  test::serve_until_done(n, "ready/1");
}


}  // namespace

TEST_CASE("a CUDA argument to another process of the host goes by IPC handle and its result comes back on the caller's device",
          "[actors][rpc][cuda][gpu_fork]") {
  if (!gpu_device_files()) {
    WARN("no CUDA device: skipped");
    return;
  }
  test::port_pipe pipe;
  auto children = spawn(1, [&](int) { serve(pipe.read()); });
  {
    node n(test::test_options(0, 2, 0));
    pipe.publish(n.port(), 1);
    n.store().wait({"ready/1"}, 30s);
    if (cuda::device_count() == 0) {
      WARN("no usable CUDA device: skipped");
    } else {
      n.set_device_map("worker1", {{0, 0}});
      // Bit-exact both ways: uint8 bytes of every value; the echo comes back on cuda:0.
      const tensor x = test::byte_pattern(4096, 3).to(cuda_device(0));
      CHECK(rpc_sync<int>(n, "worker1", "device_of", x) == 0);
      const tensor back = rpc_sync<tensor>(n, "worker1", "echo", x);
      CHECK(back.device() == cuda_device(0));
      CHECK(same_bytes_cpu(back, x));
      CHECK(n.device_transfers().ipc == 2);
      CHECK(n.device_transfers().staged == 0);
      // 64 MiB, and a view at an offset into its storage.
      const tensor big = test::byte_pattern(std::int64_t{64} << 20, 5).to(cuda_device(0));
      CHECK(same_bytes_cpu(rpc_sync<tensor>(n, "worker1", "echo", big), big));
      const tensor part = big.narrow(0, 1000, 5000);
      CHECK(same_bytes_cpu(rpc_sync<tensor>(n, "worker1", "echo", part), part));
      CHECK(n.device_transfers().ipc == 4);
      // The caller overwrites its tensor once the call completed: the callee's copy is unchanged.
      tensor y = test::byte_pattern(1 << 20, 9).to(cuda_device(0));
      const tensor expected = y.cpu().clone();
      CHECK(rpc_sync<bool>(n, "worker1", "keep", y));
      y.fill_(0.0);
      y = tensor();
      CHECK(rpc_sync<bool>(n, "worker1", "kept_equals", expected));
      // A result on a device the caller's map does not reach fails naming it and the peer.
      n.set_device_map("worker1", {});
      try {
        rpc_sync<tensor>(n, "worker1", "make_on", 0);
        FAIL("a result on an unmapped device came back");
      } catch (const error& e) {
        CHECK(e.code() == errc::device_mismatch);
        CHECK_THAT(e.message(), Catch::Contains("cuda:0") && Catch::Contains("worker1"));
      }
    }
    test::release_children(n);
  }
  CHECK(children.join(60s));
}
