// Multi-process tests of the pooled shared-memory bulk channel (Note [tensor over shared memory]).
// Many large echoes in a row and from several threads at once come back bit-exact. No segment
// is left in /dev/shm once the nodes are gone, even after a SIGKILLed peer.
#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <dirent.h>
#include <unistd.h>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/tensors/factories.hpp"

using namespace std::chrono_literals;

namespace {

troupe::rpc::registry bulk_functions() {
  troupe::rpc::registry reg;
  reg.add("echo_tensor", [](troupe::tensor t) { return t; });
  return reg;
}

// Segments in /dev/shm created by process `pid` (names "troupe_rpc_<pid>_...").
int segments_of(pid_t pid) {
  const std::string p = "troupe_rpc_" + std::to_string(pid) + "_";
  int n = 0;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (auto* e = ::readdir(d))
      if (std::strncmp(e->d_name, p.c_str(), p.size()) == 0) ++n;
    ::closedir(d);
  }
  return n;
}

void serve(std::uint16_t port, bool shm = true) {
  auto o = troupe::test::test_options(1, 2, port);
  o.shared_memory_rpc = shm;
  troupe::node n(o, bulk_functions());
  troupe::test::serve_until_done(n);
}

}  // namespace

TEST_CASE("many large echoes of different sizes, in a row and from several threads, come back bit-exact", "[actors][rpc][bulk]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { serve(pipe.read()); });
  const pid_t child = children.pids().at(0);
  {
    troupe::node n(troupe::test::test_options(0, 2, 0));
    pipe.publish(n.port(), 1);
    n.store().wait({"ready"}, 10s);
    const std::vector<std::int64_t> sizes = {1 << 20, (3 << 20) + 5, 8 << 20, (1 << 20) + 1, 2 << 20, 8 << 20};
    unsigned seed = 0;
    std::vector<std::pair<troupe::tensor, troupe::tensor>> kept;  // replies still alive pin their segments
    for (int round = 0; round < 3; ++round)
      for (auto s : sizes) {
        const auto t = troupe::test::byte_pattern(s, ++seed);
        auto back = troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo_tensor", t);
        CHECK(troupe::test::same_bytes(back, t));
        if (round == 0) kept.emplace_back(t, back);
      }
    for (const auto& [sent, back] : kept) CHECK(troupe::test::same_bytes(back, sent));  // never reused while held
    kept.clear();
    std::vector<std::thread> threads;
    std::vector<int> good(4, 0);
    for (int k = 0; k < 4; ++k)
      threads.emplace_back([&, k] {
        for (int i = 0; i < 8; ++i) {
          const auto t = troupe::test::byte_pattern((2 << 20) + k * 4096 + i, 1000u + static_cast<unsigned>(k * 100 + i));
          if (troupe::test::same_bytes(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo_tensor", t), t)) ++good[k];
        }
      });
    for (auto& th : threads) th.join();
    for (int k = 0; k < 4; ++k) CHECK(good[k] == 8);
    CHECK(segments_of(::getpid()) == 0);  // each receiver unlinked the names on first use
    troupe::test::release_children(n);
  }
  CHECK(children.join(20s));
  CHECK(segments_of(::getpid()) == 0);
  CHECK(segments_of(child) == 0);
}

TEST_CASE("a SIGKILLed peer leaves no shared-memory segment once the survivor tears down", "[actors][rpc][bulk]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { serve(pipe.read()); });
  const pid_t child = children.pids().at(0);
  {
    troupe::node n(troupe::test::test_options(0, 2, 0));
    pipe.publish(n.port(), 1);
    n.store().wait({"ready"}, 10s);
    for (unsigned i = 0; i < 4; ++i) {
      const auto t = troupe::test::byte_pattern((4 << 20) + i, i);
      CHECK(troupe::test::same_bytes(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo_tensor", t), t));
    }
    children.kill(0, SIGKILL);
    CHECK_THROWS_AS(children.join(10s), troupe::error);  // rank 1 died by SIGKILL
    n.shutdown(troupe::shutdown_mode::immediate);
  }
  CHECK(segments_of(::getpid()) == 0);
  CHECK(segments_of(child) == 0);
}

// Note [fragments], Note [direct fragment data]: without shared memory a tensor travels as bytes.
// Frames of 4 MB or more go in 256 KiB fragments. Later fragments are read straight into their
// stream's buffer, pooled and reused. Several streams interleave on one connection with small
// calls between.
TEST_CASE("large tensors sent as bytes from several threads at once, with small calls between, come back bit-exact", "[actors][rpc][bulk]") {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { serve(pipe.read(), false); });
  {
    auto o = troupe::test::test_options(0, 2, 0);
    o.shared_memory_rpc = false;
    troupe::node n(o);
    pipe.publish(n.port(), 1);
    n.store().wait({"ready"}, 10s);
    // Below and above the fragment threshold, and not multiples of a fragment.
    const std::vector<std::int64_t> sizes = {(4 << 20) - 200, (4 << 20) + 1, (6 << 20) + 5, (9 << 20) + 3};
    std::vector<std::thread> threads;
    std::vector<int> good(3, 0);
    for (int k = 0; k < 3; ++k)
      threads.emplace_back([&, k] {
        for (int i = 0; i < 6; ++i) {
          const auto t = troupe::test::byte_pattern(sizes[static_cast<std::size_t>(k + i) % sizes.size()], 500u + static_cast<unsigned>(k * 10 + i));
          if (troupe::test::same_bytes(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo_tensor", t), t)) ++good[k];
        }
      });
    int small_good = 0;
    for (int i = 0; i < 200; ++i) {
      const auto t = troupe::test::byte_pattern(100, static_cast<unsigned>(i));
      if (troupe::test::same_bytes(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo_tensor", t), t)) ++small_good;
    }
    for (auto& th : threads) th.join();
    for (int k = 0; k < 3; ++k) CHECK(good[k] == 6);
    CHECK(small_good == 200);
    troupe::test::release_children(n);
  }
  CHECK(children.join(20s));
}
