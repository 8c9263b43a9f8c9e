// Multi-process tests of the zero-copy bulk channel (Note [tensor over shared memory]):
// - a large received tensor is the sender's segment;
// - sending it on (echo, forward) passes a reference instead of copying;
// - ordinary tensors keep value semantics, shared ones are shared;
// - duplicated frames keep the reference counts exact;
// - a SIGKILLed peer leaves nothing mapped or named.
#include <csignal>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <dirent.h>
#include <unistd.h>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/shared_memory.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/tensors/factories.hpp"

using namespace std::chrono_literals;

namespace {

constexpr std::int64_t big = 3 << 20;  // over the 1 MiB bulk threshold, not a power of two

unsigned char byte0(const troupe::tensor& t) { return *static_cast<const unsigned char*>(t.data_ptr()); }

// The file behind the mapping of this process that contains `p` ("" if none): /proc/self/maps.
std::string mapping_of(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream in(line);
    in >> std::hex >> lo >> dash >> hi;
    if (a < lo || a >= hi) continue;
    const auto slash = line.find('/');
    return slash == std::string::npos ? std::string() : line.substr(slash);
  }
  return {};
}

// Mappings in this process of rpc segments owned by `owner`.
int rpc_mappings(pid_t owner) {
  const std::string name = "memfd:troupe_rpc_" + std::to_string(owner) + "_";
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);)
    if (line.find(name) != std::string::npos) ++n;
  return n;
}

std::string own_segment_prefix() { return "/memfd:troupe_rpc_" + std::to_string(::getpid()) + "_"; }

// What a worker keeps between calls (one per child process).
troupe::tensor& kept() {
  static troupe::tensor t;
  return t;
}

troupe::rpc::registry functions() {
  troupe::rpc::registry reg;
  reg.add("echo", [](troupe::tensor t) { return t; });
  reg.add("keep", [](troupe::tensor t) { kept() = t; return troupe::is_shared(t); });
  reg.add("keep_and_echo", [](troupe::tensor t) { kept() = t; return t; });
  reg.add("kept_byte0", [](int) { return static_cast<int>(byte0(kept())); });
  reg.add("make", [](std::int64_t n) { return troupe::test::byte_pattern(n, 77); });
  reg.add("fill", [](troupe::tensor t, int v) {  // writes into what it received, in place
    std::memset(t.data_ptr(), v, t.nbytes());
    return troupe::is_shared(t) && mapping_of(t.data_ptr()).find("troupe_rpc_") == std::string::npos;
  });
  reg.add("make_shared", [](std::int64_t n, int strategy) {  // a shared tensor nobody here keeps
    troupe::shm_provider p(static_cast<troupe::sharing_strategy>(strategy), "zc");
    auto t = troupe::test::byte_pattern(n, 55);
    troupe::share_memory_(t, p);
    return t;
  });
  return reg;
}

// Serves `functions()` (plus "forward" to worker2 on rank 1 of a 3-world) until told "done".
void serve(int rank, int world, std::uint16_t port, std::shared_ptr<troupe::transport_hook> hook = nullptr) {
  troupe::node n(troupe::test::test_options(rank, world, port), functions(), std::move(hook));
  n.functions().add("forward", [&n](troupe::tensor t) { return troupe::rpc_sync<troupe::tensor>(n, "worker2", "echo", t); });
  troupe::test::serve_until_done(n, "ready/" + std::to_string(rank));
}

// Delivers every request twice (the fault plan's duplicate).
class duplicate_requests final : public troupe::transport_hook {
 public:
  troupe::transport_decision on_receive(troupe::envelope& m) override {
    return {m.kind == troupe::message_kind::rpc_request && m.function == "keep_and_echo" ? 2 : 1, {}};
  }
};

// Runs `body(n)` on rank 0 of a job whose ranks 1..workers serve functions() (with `hook`), then
// ends the job gracefully and joins the workers.
template <class Body>
void with_workers(int workers, const Body& body, std::shared_ptr<troupe::transport_hook> hook = nullptr) {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(workers, [&](int i) { serve(i + 1, workers + 1, pipe.read(), hook); });
  {
    troupe::node n(troupe::test::test_options(0, workers + 1, 0));
    pipe.publish(n.port(), workers);
    std::vector<std::string> ready;
    for (int r = 1; r <= workers; ++r) ready.push_back("ready/" + std::to_string(r));
    n.store().wait(ready, 10s);
    body(n);
    troupe::test::release_children(n);
  }
  CHECK(children.join(20s));
}

}  // namespace

TEST_CASE("a large tensor echoed back is a reference to the caller's own segment, not a copy", "[actors][rpc][bulk]") {
  with_workers(2, [&](troupe::node& n) {
    const auto t = troupe::test::byte_pattern(big, 1);
    const auto back = troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", t);
    CHECK(troupe::test::same_bytes(back, t));
    CHECK(troupe::is_shared(back));
    CHECK(mapping_of(back.data_ptr()).rfind(own_segment_prefix(), 0) == 0);  // the callee copied nothing
    // worker1 forwards what it received to worker2, which echoes it: still the caller's segment.
    const auto fwd = troupe::rpc_sync<troupe::tensor>(n, "worker1", "forward", troupe::test::byte_pattern(big, 2));
    CHECK(troupe::test::same_bytes(fwd, troupe::test::byte_pattern(big, 2)));
    CHECK(mapping_of(fwd.data_ptr()).rfind(own_segment_prefix(), 0) == 0);
    CHECK(troupe::test::same_bytes(back, t));  // neither transfer reused the segment `back` still holds
  });
}

TEST_CASE("an ordinary tensor is copied in: the sender's later writes never reach what the receiver kept",
          "[actors][rpc][bulk]") {
  with_workers(1, [&](troupe::node& n) {
    auto t = troupe::empty({big}, troupe::tensor_options{troupe::dtype::uint8});
    std::memset(t.data_ptr(), 1, t.nbytes());
    CHECK(troupe::rpc_sync<bool>(n, "worker1", "keep", t));  // the callee sees shared memory
    std::memset(t.data_ptr(), 2, t.nbytes());
    CHECK(troupe::rpc_sync<int>(n, "worker1", "kept_byte0", 0) == 1);
    // The kept tensor pins its segment: later transfers of the same size use another one.
    for (unsigned i = 0; i < 3; ++i) CHECK(troupe::test::same_bytes(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", troupe::test::byte_pattern(big, i)), troupe::test::byte_pattern(big, i)));
    CHECK(troupe::rpc_sync<int>(n, "worker1", "kept_byte0", 0) == 1);
  });
}

TEST_CASE("a received large tensor is shared memory: a write through the echo reaches the callee's kept view",
          "[actors][rpc][bulk]") {
  with_workers(1, [&](troupe::node& n) {
    const auto t = troupe::test::byte_pattern(big, 5);
    auto back = troupe::rpc_sync<troupe::tensor>(n, "worker1", "keep_and_echo", t);
    REQUIRE(troupe::test::same_bytes(back, t));
    *static_cast<unsigned char*>(back.data_ptr()) = 42;
    CHECK(troupe::rpc_sync<int>(n, "worker1", "kept_byte0", 0) == 42);
    CHECK(byte0(t) != 42);  // the caller's own tensor was copied in, never shared
  });
}

TEST_CASE("duplicated requests carrying a large tensor keep every reference: no segment is reused while held",
          "[actors][rpc][bulk][fault]") {
  with_workers(1, [&](troupe::node& n) {
    std::vector<std::pair<troupe::tensor, troupe::tensor>> held;
    for (unsigned i = 0; i < 6; ++i) {
      const auto t = troupe::test::byte_pattern(big, 100 + i);
      auto back = troupe::rpc_sync<troupe::tensor>(n, "worker1", "keep_and_echo", t);  // served twice
      CHECK(troupe::test::same_bytes(back, t));
      held.emplace_back(t, std::move(back));
    }
    for (const auto& [sent, back] : held) CHECK(troupe::test::same_bytes(back, sent));
    held.clear();
    for (unsigned i = 0; i < 4; ++i) {
      const auto t = troupe::test::byte_pattern(big, 200 + i);
      CHECK(troupe::test::same_bytes(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", t), t));
    }
  }, std::make_shared<duplicate_requests>());
}

TEST_CASE("a tensor received from a peer that is then SIGKILLed stays readable, and nothing is left mapped or named",
          "[actors][rpc][bulk][fault]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { serve(1, 2, pipe.read()); });
  const pid_t child = children.pids().at(0);
  const int names_before = troupe::test::rpc_names_in_dev_shm();
  {
    troupe::node n(troupe::test::test_options(0, 2, 0));
    pipe.publish(n.port(), 1);
    n.store().wait({"ready/1"}, 10s);
    auto made = troupe::rpc_sync<troupe::tensor>(n, "worker1", "make", std::int64_t{big});  // the child's segment
    CHECK(mapping_of(made.data_ptr()).rfind("/memfd:troupe_rpc_" + std::to_string(child) + "_", 0) == 0);
    CHECK(rpc_mappings(child) > 0);
    CHECK(troupe::rpc_sync<bool>(n, "worker1", "keep", troupe::test::byte_pattern(big, 9)));  // the child holds one of ours
    children.kill(0, SIGKILL);
    CHECK_THROWS_AS(children.join(10s), troupe::error);  // rank 1 died by SIGKILL
    CHECK(troupe::test::same_bytes(made, troupe::test::byte_pattern(big, 77)));
    made = troupe::tensor();
    n.shutdown(troupe::shutdown_mode::immediate);
  }
  CHECK(rpc_mappings(child) == 0);
  CHECK(rpc_mappings(::getpid()) == 0);
  CHECK(troupe::test::rpc_names_in_dev_shm() == names_before);
}

TEST_CASE("a share_memory_() tensor travels by handle with both strategies: writes are shared both ways and a "
          "dropped one stays alive until the receiver mapped it", "[actors][rpc][bulk]") {
  const auto strategy = GENERATE(troupe::sharing_strategy::file_descriptor, troupe::sharing_strategy::file_system);
  with_workers(1, [&](troupe::node& n) {
    troupe::shm_provider provider(strategy, "zc");
    auto t = troupe::test::byte_pattern(big, 3);
    troupe::share_memory_(t, provider);
    CHECK(troupe::rpc_sync<bool>(n, "worker1", "fill", t, 9));  // the callee mapped our segment
    CHECK(byte0(t) == 9);
    CHECK(static_cast<const unsigned char*>(t.data_ptr())[big - 1] == 9);
    CHECK(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", t).storage() == t.storage());  // ours, back
    // An argument nobody keeps: only the pin holds its storage until the callee mapped it.
    std::weak_ptr<troupe::storage> weak;
    auto f = [&] {
      auto tmp = troupe::test::byte_pattern(big, 4);
      troupe::share_memory_(tmp, provider);
      weak = tmp.storage();
      return troupe::rpc_async<bool>(n, "worker1", "fill", tmp, 7);
    }();
    CHECK(f.get());
    CHECK(troupe::rpc_sync<bool>(n, "worker1", "fill", t, 8));  // its pin sweeps the released one
    CHECK(weak.expired());
    // A result nobody keeps on the callee's side arrives intact, as the callee's segment.
    const auto made = troupe::rpc_sync<troupe::tensor>(n, "worker1", "make_shared", std::int64_t{big}, static_cast<int>(strategy));
    CHECK(troupe::test::same_bytes(made, troupe::test::byte_pattern(big, 55)));
    CHECK(troupe::is_shared(made));
    CHECK(mapping_of(made.data_ptr()).find("troupe_rpc_") == std::string::npos);
  });
}
