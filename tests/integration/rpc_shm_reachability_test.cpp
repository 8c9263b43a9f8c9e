// Multi-process tests of Note [shm reachability] (actors/src/rpc/bulk.hpp). A large tensor goes
// through shared memory only toward a peer that showed, at the first contact, that it can open
// this process's memory. That peer tells it, even to a node that never said hello to it.
// Otherwise the tensor travels as bytes. Every call must succeed bit-exact either way, in both
// directions of the connection (requests and responses).
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/capability.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>
#include <dirent.h>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/shared_memory.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/tensors/factories.hpp"

using namespace std::chrono_literals;

namespace {

constexpr std::int64_t big = (3 << 20) + 12;  // over the 1 MiB threshold

// 1 when `t` arrived through shared memory, 0 when as bytes, -1 when its bytes are wrong.
int arrived(const troupe::tensor& t, int seed) {
  if (!troupe::test::same_bytes(t, troupe::test::byte_pattern(big, static_cast<unsigned>(seed)))) return -1;
  return troupe::is_shared(t) ? 1 : 0;
}

// Whether this process may open another's descriptors. Reading the link of one of its
// /proc/<pid>/fd entries takes the same ptrace-read check as opening a peer's segment. Listing
// the directory does not.
bool may_open_fds_of(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return false;
  bool ok = false;
  while (auto* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char link[256];
    ok = ::readlink((dir + "/" + e->d_name).c_str(), link, sizeof link) >= 0;
    break;
  }
  ::closedir(d);
  return ok;
}

// Makes this process unable to open its parent's memory while the parent can still open its
// own, or the reverse. As root, it drops every capability: a process may not read one whose
// capabilities are not a subset of its own. Otherwise it becomes non-dumpable: nobody without
// CAP_SYS_PTRACE may read it.
void become_asymmetric() {
  if (::geteuid() == 0) {
    __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2] = {};
    if (::syscall(SYS_capset, &hdr, data) != 0) throw troupe::error(troupe::errc::io_error, "capset failed");
  } else if (::prctl(PR_SET_DUMPABLE, 0) != 0) {
    throw troupe::error(troupe::errc::io_error, "prctl(PR_SET_DUMPABLE) failed");
  }
}

enum class mode { defaults, off, asymmetric };

// Pages this process faulted in so far.
long minor_faults() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

troupe::rpc::registry functions() {
  troupe::rpc::registry reg;
  reg.add("arrived", [](troupe::tensor t, int seed) { return arrived(t, seed); });
  reg.add("echo", [](troupe::tensor t) { return t; });
  reg.add("faults", [] { return minor_faults(); });
  return reg;
}

void serve(std::uint16_t port, mode m) {
  if (m == mode::asymmetric) become_asymmetric();
  auto opts = troupe::test::test_options(1, 2, port);
  opts.shared_memory_rpc = m != mode::off;
  auto reg = functions();
  troupe::node* self = nullptr;
  // The child's own requests to rank 0 (and rank 0's responses), made while rank 0 waits.
  reg.add("call_back", [&self](int seed) {
    return troupe::rpc_sync<int>(*self, "worker0", "arrived", troupe::test::byte_pattern(big, static_cast<unsigned>(seed)), seed);
  });
  troupe::node n(opts, std::move(reg));
  self = &n;
  n.store().set("child_may_open_parent", may_open_fds_of(::getppid()) ? "1" : "0");
  // Before rank 0 ever calls this node: its response can only follow what this node told it.
  const auto t = troupe::test::byte_pattern(big, 30);
  const auto back = troupe::rpc_sync<troupe::tensor>(n, "worker0", "echo", t);
  n.store().set("child_echo", !troupe::test::same_bytes(back, t) ? "-1" : troupe::is_shared(back) ? "1" : "0");
  troupe::test::serve_until_done(n);
}

// What arrived where: each direction through shared memory (1) or as bytes (0).
struct seen {
  int at_child = -2;   // a request of rank 0's
  int at_parent = -2;  // a request of the child's
  int child_echo = -2;  // rank 0's response to the child's first call, before rank 0 said hello
  bool echoes_exact = false;
};

seen run(mode m, bool& child_may_open_parent, bool& parent_may_open_child) {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { serve(pipe.read(), m); });
  seen s;
  {
    troupe::node n(troupe::test::test_options(0, 2, 0), functions());
    pipe.publish(n.port(), 1);
    n.store().wait({"ready"}, 10s);
    child_may_open_parent = n.store().get("child_may_open_parent", 10s) == "1";
    parent_may_open_child = may_open_fds_of(children.pids().at(0));
    s.child_echo = std::stoi(n.store().get("child_echo", 10s));
    s.at_child = troupe::rpc_sync<int>(n, "worker1", "arrived", troupe::test::byte_pattern(big, 7), 7);
    s.at_parent = troupe::rpc_sync<int>(n, "worker1", "call_back", 8);
    s.echoes_exact = true;
    for (unsigned i = 0; i < 3; ++i) {
      const auto t = troupe::test::byte_pattern(big + i, 20 + i);
      s.echoes_exact = s.echoes_exact && troupe::test::same_bytes(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", t), t);
    }
    troupe::test::release_children(n);
  }
  CHECK(children.join(20s));
  return s;
}

// What each direction should have used: 1 shared memory, 0 bytes. `into_child`: rank 0's
// requests and its responses to the child; `into_parent`: the child's requests.
void expect_paths(const seen& s, int into_child, int into_parent) {
  CHECK(s.child_echo == into_child);
  CHECK(s.at_child == into_child);
  CHECK(s.at_parent == into_parent);
  CHECK(s.echoes_exact);
}

}  // namespace

TEST_CASE("by default large tensors between processes of one host go through shared memory both ways", "[actors][rpc][bulk]") {
  bool child_can = false, parent_can = false;
  const seen s = run(mode::defaults, child_can, parent_can);
  REQUIRE(child_can);
  REQUIRE(parent_can);
  expect_paths(s, 1, 1);
}


TEST_CASE("a node with shared_memory_rpc off gets and sends large tensors as bytes, bit-exact, both ways", "[actors][rpc][bulk]") {
  bool child_can = false, parent_can = false;
  const seen s = run(mode::off, child_can, parent_can);
  expect_paths(s, 0, 0);
}

TEST_CASE("when only one of two processes can open the other's memory, each direction picks what works", "[actors][rpc][bulk]") {
  bool child_can = false, parent_can = false;
  const seen s = run(mode::asymmetric, child_can, parent_can);
  INFO("child may open rank 0's memory: " << child_can << ", rank 0 the child's: " << parent_can);
  REQUIRE(child_can != parent_can);  // the setup did make access one-sided
  // Rank 0's requests use shared memory only if the child can open rank 0's segments. The
  // child's use it only if rank 0 can open the child's. Anything else would fail to decode.
  expect_paths(s, child_can ? 1 : 0, parent_can ? 1 : 0);
}

namespace {

// Rank 0 with shared memory off (and `hook`, if any) against a child serving with it off too:
// every tensor travels as bytes. Runs `body` on rank 0's node, then shuts both down.
void with_bytes_peer(const std::function<void(troupe::node&)>& body, std::shared_ptr<troupe::transport_hook> hook = nullptr) {
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { serve(pipe.read(), mode::off); });
  {
    auto opts = troupe::test::test_options(0, 2, 0);
    opts.shared_memory_rpc = false;
    troupe::node n(opts, functions(), std::move(hook));
    pipe.publish(n.port(), 1);
    n.store().wait({"ready"}, 10s);
    body(n);
    troupe::test::release_children(n);
  }
  CHECK(children.join(20s));
}

}  // namespace

TEST_CASE("as bytes, large echoes and small calls from several threads at once come back bit-exact", "[actors][rpc][bulk]") {
  // Frames written in pieces (rpc/split_frame.hpp) and in fragments (Note [fragments]) while
  // other writers queue behind them or pass between them, and large frames read in pieces on both
  // sides.
  with_bytes_peer([&](troupe::node& n) {
    std::vector<std::thread> threads;
    std::vector<int> good(4, 0), small(4, 0);
    for (int k = 0; k < 4; ++k)
      threads.emplace_back([&, k] {
        for (int i = 0; i < 6; ++i) {
          // 2 MB, 70 kB, and 5 MB from two threads (pooled buffers, Note [byte pool]).
          const std::int64_t size = k == 0 ? (2 << 20) : k == 1 ? 70'000 : (5 << 20);
          const auto t = troupe::test::byte_pattern(size + 4096 * k + i, 500u + static_cast<unsigned>(k * 10 + i));
          auto f = troupe::rpc_async<troupe::tensor>(n, "worker1", "echo", t);
          const auto tiny = troupe::test::byte_pattern(16, static_cast<unsigned>(i));
          if (troupe::test::same_bytes(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", tiny), tiny)) ++small[k];
          if (troupe::test::same_bytes(f.get(), t)) ++good[k];
        }
      });
    for (auto& th : threads) th.join();
    for (int k = 0; k < 4; ++k) {
      CHECK(good[k] == 6);
      CHECK(small[k] == 6);
    }
    // Far larger than a socket's buffer: sendmsg returns short many times, mid-buffer too.
    const auto huge = troupe::test::byte_pattern((24 << 20) + 3, 77);
    CHECK(troupe::test::same_bytes(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", huge), huge));
  });
}

TEST_CASE("as bytes, 64 MB echoes reuse their buffers on both sides instead of faulting fresh pages in each time", "[actors][rpc][bulk]") {
  // Note [byte pool]: glibc maps every buffer of 64 MB or more afresh. That happens on the
  // callee's executor threads, and on any thread above its mmap threshold. It costs 16k page
  // faults per buffer per message.
  with_bytes_peer([&](troupe::node& n) {
    const auto t = troupe::test::byte_pattern((64 << 20) + 12, 91);
    for (int i = 0; i < 2; ++i) REQUIRE(troupe::test::same_bytes(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", t), t));
    const long callee_before = troupe::rpc_sync<long>(n, "worker1", "faults");
    const long caller_before = minor_faults();
    bool exact = true;
    for (int i = 0; i < 3; ++i) exact = troupe::test::same_bytes(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", t), t) && exact;
    const long caller = minor_faults() - caller_before;
    const long callee = troupe::rpc_sync<long>(n, "worker1", "faults") - callee_before;
    CHECK(exact);
    INFO("page faults over three 64 MB echoes: caller " << caller << ", callee " << callee);
    CHECK(caller < 4000);  // one buffer faulted in afresh would be 16k
    CHECK(callee < 4000);
  });
}

namespace {

// Duplicates the first large request it sends and delays the second (a delayed frame is kept
// whole, not fragmented); counts them.
struct large_request_plan : troupe::transport_hook {
  std::atomic<int> large{0};
  troupe::transport_decision on_send(troupe::envelope& m) override {
    if (m.kind != troupe::message_kind::rpc_request || m.payload.size() < (std::size_t{4} << 20)) return {};
    const int n = ++large;
    return {n == 1 ? 2 : 1, n == 2 ? 20ms : 0ms};
  }
};

}  // namespace

TEST_CASE("as bytes, large requests a fault plan duplicates or delays come back bit-exact, and the connection goes on", "[actors][rpc][bulk]") {
  // Note [fragments]: a duplicated frame is two streams of fragments; a delayed one goes whole.
  auto plan = std::make_shared<large_request_plan>();
  with_bytes_peer([&](troupe::node& n) {
    for (unsigned i = 0; i < 3; ++i) {
      const auto t = troupe::test::byte_pattern((9 << 20) + 5 + i, 40 + i);
      CHECK(troupe::test::same_bytes(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", t), t));
    }
    CHECK(plan->large == 3);
    const auto tiny = troupe::test::byte_pattern(16, 3);
    CHECK(troupe::test::same_bytes(troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", tiny), tiny));
  }, plan);
}
