// Note [borrowed tensor bytes] (rpc/borrowed_parts.hpp) between processes. rpc_sync's large
// tensor sent as bytes goes out from its own storage, and the send returns once it is written.
// rpc_async's is copied. Either way the caller may change the tensor once the call returns,
// and the storage is no longer held.
#include <cstring>
#include <filesystem>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/tensors/factories.hpp"

using namespace std::chrono_literals;

namespace {

troupe::rpc::registry functions() {
  troupe::rpc::registry reg;
  reg.add("echo_tensor", [](troupe::tensor t) { return t; });
  reg.add("echo_two", [](troupe::tensor a, std::string s, troupe::tensor b) { return std::make_tuple(b, s, a); });
  return reg;
}

void serve(std::uint16_t port) {
  auto o = troupe::test::test_options(1, 2, port);
  o.shared_memory_rpc = false;  // tensors travel as inline bytes, as between hosts
  troupe::node n(o, functions());
  troupe::test::serve_until_done(n);
}

// The threads of this process.
long threads() {
  const std::filesystem::directory_iterator tasks("/proc/self/task");
  return static_cast<long>(std::distance(std::filesystem::begin(tasks), std::filesystem::end(tasks)));
}

// Runs `calls` on a node whose worker1, another process, serves functions() without shared
// memory: tensors travel as inline bytes.
void with_inline_peer(const std::function<void(troupe::node&)>& calls) {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { serve(pipe.read()); });
  {
    auto o = troupe::test::test_options(0, 2, 0);
    o.shared_memory_rpc = false;
    troupe::node n(o);
    pipe.publish(n.port(), 1);
    n.store().wait({"ready"}, 10s);
    calls(n);
    troupe::test::release_children(n);
  }
  CHECK(children.join(30s));
}

}  // namespace

TEST_CASE("rpc_sync writes a large inline argument on the calling thread, rpc_async on the node's frame writer",
          "[actors][rpc][bulk]") {
  with_inline_peer([](troupe::node& n) {
    const auto t = troupe::test::byte_pattern(std::int64_t{16} << 20, 5);
    CHECK(troupe::test::same_bytes(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo_tensor", troupe::zeros({4}), 60s), troupe::zeros({4})));
    const long before = threads();
    // Note [borrowed tensor bytes]: the request borrows the tensor's bytes and goes out on this
    // thread, so the node's frame writer thread (Note [fragments]) is never started.
    for (int i = 0; i < 3; ++i) CHECK(troupe::test::same_bytes(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo_tensor", t, 60s), t));
    CHECK(threads() == before);
    // rpc_async copies the bytes into its request, which the frame writer sends.
    CHECK(troupe::test::same_bytes(troupe::rpc_async<troupe::tensor>(n, "worker1", "echo_tensor", t, 60s).get(), t));
    CHECK(threads() == before + 1);
  });
}

TEST_CASE("an inline 64 MB tensor changed right after rpc_async returns arrives as it was, and its storage is free again",
          "[actors][rpc][bulk]") {
  with_inline_peer([](troupe::node& n) {
    auto t = troupe::test::byte_pattern(std::int64_t{64} << 20, 11);
    auto original = troupe::empty(t.sizes(), troupe::tensor_options{t.dtype()});
    std::memcpy(original.data_ptr(), t.data_ptr(), t.nbytes());
    auto f = troupe::rpc_async<troupe::tensor>(n, "worker1", "echo_tensor", t, 60s);  // a loaded CI machine is slow
    CHECK(t.impl().use_count() == 1);             // nothing of the send holds the tensor any more
    std::memset(t.data_ptr(), 0xa5, t.nbytes());  // the caller's tensor changes at once
    CHECK(troupe::test::same_bytes(f.get(), original));
    // Two borrowed tensors around a string, in the request and, swapped, in the response.
    const auto a = troupe::test::byte_pattern((5 << 20) + 7, 3);
    const auto b = troupe::test::byte_pattern((1 << 20) + 1, 4);
    const auto [b2, s2, a2] =
        troupe::rpc_sync<std::tuple<troupe::tensor, std::string, troupe::tensor>>(n, "worker1", "echo_two", a, std::string("mid"), b, 60s);
    CHECK(troupe::test::same_bytes(a2, a));
    CHECK(troupe::test::same_bytes(b2, b));
    CHECK(s2 == "mid");
  });
}
