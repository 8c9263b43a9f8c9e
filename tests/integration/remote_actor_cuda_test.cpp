// CUDA tensors in remote actor messages (Note [remote actors], Note [rpc device map]). A
// request's tensors land on the device the sender's map names. A response comes back on the
// requester's device by the reverse map. An unmapped device fails the request naming it and the
// worker. Needs a GPU: skips visibly without.
#include <unistd.h>

#include <catch2/catch.hpp>

#include "integration/actor_child.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/tensors/cuda.hpp"
#include "troupe/tensors/factories.hpp"

using namespace std::chrono_literals;
using namespace troupe::test;
using troupe::errc;
using troupe::tensor;

namespace {

// Whether the machine has an NVIDIA device node: checked before fork without initialising CUDA
// (a child forked after the parent initialised CUDA cannot use it).
bool gpu_device_files() { return ::access("/dev/nvidiactl", F_OK) == 0; }

bool same_bytes_cpu(const tensor& a, const tensor& b) { return same_bytes(a.cpu().contiguous(), b.cpu().contiguous()); }

// The response to one request, or the request's error as a troupe::error.
template <class R, class... Ts>
R ask(caf::actor_system& sys, const caf::actor& to, Ts&&... xs) {
  caf::scoped_actor self{sys};
  R out{};
  caf::error err;
  self->request(to, 30s, std::forward<Ts>(xs)...).receive([&](R& r) { out = std::move(r); }, [&](caf::error& e) { err = e; });
  if (err) throw troupe::error(as_error(err).code(), sys.render(err));  // the rendering keeps CAF's context
  return out;
}

}  // namespace

TEST_CASE("a CUDA tensor in a remote actor message lands on the mapped device and its response comes back on the requester's device",
          "[actors][integration][cuda][gpu_fork]") {
  if (!gpu_device_files()) {
    WARN("no CUDA device: skipped");
    return;
  }
  port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { actor_child(pipe, true); });
  {
    troupe::node n(actor_options(0, 2, 0, true));
    pipe.publish(n.port(), 1);
    auto echo = troupe::lookup_actor(n, "worker1", "echo", 10s);
    auto& sys = n.system();
    if (troupe::cuda::device_count() == 0) {
      WARN("no usable CUDA device: skipped");
    } else {
      n.set_device_map("worker1", {{0, 0}});
      const auto cuda0 = troupe::cuda_device(0);
      // A CPU tensor under the map stays on the CPU, both ways.
      CHECK(ask<std::int32_t>(sys, echo, device_atom::value, byte_pattern(64, 1)) == -1);
      CHECK(ask<tensor>(sys, echo, byte_pattern(64, 1)).device().is_cpu());
      for (std::int64_t bytes : {std::int64_t{16}, std::int64_t{4} << 20}) {
        const tensor x = byte_pattern(bytes, 11).to(cuda0);
        CHECK(ask<std::int32_t>(sys, echo, device_atom::value, x) == 0);  // arrived on cuda:0
        tensor back;
        CHECK_NOTHROW(back = ask<tensor>(sys, echo, x));
        if (back.defined()) {
          CHECK(back.device() == cuda0);
          CHECK(same_bytes_cpu(back, x));
        }
        // A user struct with a CUDA tensor inside.
        sample got;
        CHECK_NOTHROW(got = ask<sample>(sys, echo, sample{3, "gpu", x}));
        CHECK(got.step == 4);
        if (got.data.defined()) {
          CHECK(got.data.device() == cuda0);
          CHECK(same_bytes_cpu(got.data, x));
        }
      }
      CHECK(n.device_transfers().staged == 6);  // every argument staged: actor messages never use IPC
      CHECK(n.device_transfers().ipc == 0);
      // Without a map entry for cuda:0 the request fails at the sender, naming device and worker.
      n.set_device_map("worker1", {});
      std::string message;
      CHECK(code_of([&] { ask<tensor>(sys, echo, byte_pattern(64, 2).to(cuda0)); }, &message) == errc::device_mismatch);
      CHECK_THAT(message, Catch::Contains("cuda:0") && Catch::Contains("worker1"));
    }
    echo = nullptr;
    release_children(n);
  }
  CHECK(children.join(60s));
}
