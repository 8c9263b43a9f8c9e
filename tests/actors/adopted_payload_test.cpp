// Note [adopted payload] (troupe/actors/rpc/codec.hpp): a large tensor received as inline bytes
// views the payload it came in instead of being copied out of it, and keeps that payload alive.
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "troupe/actors/rpc/api.hpp"
#include "troupe/tensors/factories.hpp"

using namespace std::chrono_literals;

namespace {

troupe::tensor pattern(std::int64_t n, float base) {
  auto t = troupe::empty({n}, troupe::dtype::float32);
  auto* p = static_cast<float*>(t.data_ptr());
  for (std::int64_t i = 0; i < n; ++i) p[i] = base + static_cast<float>(i % 1000);
  return t;
}

bool has_pattern(const troupe::tensor& t, float base) {
  const auto* p = static_cast<const float*>(t.data_ptr());
  for (std::int64_t i = 0; i < t.numel(); ++i)
    if (p[i] != base + static_cast<float>(i % 1000)) return false;
  return true;
}

bool inside(const troupe::tensor& t, const std::vector<char>& bytes) {
  const auto* p = static_cast<const char*>(t.data_ptr());
  return p >= bytes.data() && p + t.nbytes() <= bytes.data() + bytes.size();
}

using troupe::rpc::detail::payload_keeper;

troupe::tensor decode_one(const std::vector<char>& bytes, const payload_keeper* keep = nullptr) {
  troupe::rpc::codec_context ctx;
  ctx.keeper = keep;
  return std::get<0>(troupe::rpc::decode_args<troupe::tensor>(ctx, bytes, "f"));
}

}  // namespace

TEST_CASE("a large inline tensor read under a payload keeper views the payload and keeps it alive", "[actors][codec]") {
  auto owner = std::make_shared<std::vector<char>>(troupe::rpc::encode_args(pattern(1 << 18, 5.0f)));  // 1 MiB
  std::weak_ptr<std::vector<char>> alive = owner;
  troupe::tensor back;
  {
    payload_keeper keep(*owner, owner);
    back = decode_one(*owner, &keep);
  }
  CHECK(inside(back, *owner));
  CHECK(reinterpret_cast<std::uintptr_t>(back.data_ptr()) % 16 == 0);
  CHECK((reinterpret_cast<const char*>(back.data_ptr()) - owner->data()) % 64 == 0);  // the writer's padding
  owner.reset();
  REQUIRE_FALSE(alive.expired());  // the tensor holds the payload
  CHECK(has_pattern(back, 5.0f));
  back = troupe::tensor();
  CHECK(alive.expired());
}

TEST_CASE("without a keeper of its buffer, or when small, an inline tensor is copied", "[actors][codec]") {
  const auto big = troupe::rpc::encode_args(pattern(1 << 18, 1.0f));
  const auto small = troupe::rpc::encode_args(pattern(1000, 2.0f));  // 4 KB: under adopt_min_bytes
  auto other = std::make_shared<std::vector<char>>(troupe::rpc::encode_args(pattern(1 << 18, 3.0f)));
  auto no_keeper = decode_one(big);
  CHECK_FALSE(inside(no_keeper, big));
  CHECK(has_pattern(no_keeper, 1.0f));
  payload_keeper keep(*other, other);  // a keeper of another buffer
  auto elsewhere = decode_one(big, &keep);
  CHECK_FALSE(inside(elsewhere, big));
  auto small_owner = std::make_shared<std::vector<char>>(small);
  payload_keeper keep_small(*small_owner, small_owner);
  auto tiny = decode_one(*small_owner, &keep_small);
  CHECK_FALSE(inside(tiny, *small_owner));
  CHECK(has_pattern(tiny, 2.0f));
  CHECK_FALSE(inside(decode_one(*other), *other));  // its keeper is not in this decode's context
  auto viewed = decode_one(*other, &keep);
  CHECK(inside(viewed, *other));
  CHECK(has_pattern(viewed, 3.0f));
}

namespace {
// `bytes` in a buffer of exactly `capacity` bytes.
std::shared_ptr<std::vector<char>> with_capacity(const std::vector<char>& bytes, std::size_t capacity) {
  auto v = std::make_shared<std::vector<char>>();
  v->reserve(capacity);
  v->assign(bytes.begin(), bytes.end());
  return v;
}
}  // namespace

TEST_CASE("a tensor filling less than half of its payload's buffer is copied, so a kept tensor pins at most twice its bytes", "[actors][codec]") {
  const auto one = troupe::rpc::encode_args(pattern(1 << 18, 4.0f));  // 1 MiB of data
  const std::size_t data = std::size_t{1} << 20;
  auto fits = with_capacity(one, 2 * data);
  REQUIRE(fits->capacity() == 2 * data);
  auto larger = with_capacity(one, 2 * data + 1);
  REQUIRE(larger->capacity() == 2 * data + 1);
  {
    payload_keeper keep(*fits, fits);
    auto t = decode_one(*fits, &keep);
    CHECK(inside(t, *fits));  // exactly half: viewed
    CHECK(has_pattern(t, 4.0f));
  }
  {
    payload_keeper keep(*larger, larger);
    auto t = decode_one(*larger, &keep);
    CHECK_FALSE(inside(t, *larger));  // less than half (a pooled buffer four times too large, say)
    CHECK(has_pattern(t, 4.0f));
  }
  // Two tensors of one payload: neither fills half of it, both are copied.
  auto two = std::make_shared<std::vector<char>>(troupe::rpc::encode_args(pattern(1 << 18, 6.0f), pattern(1 << 18, 7.0f)));
  payload_keeper keep(*two, two);
  troupe::rpc::codec_context ctx;
  ctx.keeper = &keep;
  auto [a, b] = troupe::rpc::decode_args<troupe::tensor, troupe::tensor>(ctx, *two, "f");
  CHECK_FALSE(inside(a, *two));
  CHECK_FALSE(inside(b, *two));
  CHECK(has_pattern(a, 6.0f));
  CHECK(has_pattern(b, 7.0f));
}

TEST_CASE("an inline tensor with padding of 64 bytes or more is refused", "[actors][codec]") {
  auto bytes = troupe::rpc::encode_args(pattern(4, 0.0f));
  // u32 count, string tag "tensor" (u64 length + 6), kind, defined, dtype, u32 rank, one i64 size,
  // u64 byte count: the padding count follows.
  const std::size_t pad_at = 4 + 8 + 6 + 1 + 1 + 1 + 4 + 8 + 8;
  REQUIRE(bytes.size() > pad_at);
  const auto pad = static_cast<unsigned char>(bytes[pad_at]);
  REQUIRE(pad < 64);
  REQUIRE(bytes.size() == pad_at + 1 + pad + 16);  // the count, the zeros, four floats
  bytes[pad_at] = static_cast<char>(64);
  CHECK_THROWS_AS(decode_one(bytes), troupe::error);
}

namespace {

troupe::node_options bytes_only(int rank, std::uint16_t master_port) {
  troupe::node_options o;
  o.job_token = "t";
  o.default_timeout = 10s;
  o.rank = rank;
  o.world_size = 2;
  o.master_port = master_port;
  o.shared_memory_rpc = false;  // tensors as inline bytes on the direct connection
  return o;
}

// Serves the requests of `function` `copies` times (on the receiving node: the same request runs
// twice, as a fault plan's duplicate does).
struct duplicate_on_receive : troupe::transport_hook {
  std::string function;
  troupe::transport_decision on_send(troupe::envelope&) override { return {}; }
  troupe::transport_decision on_receive(troupe::envelope& m) override {
    if (m.kind == troupe::message_kind::rpc_request && m.function == function) return {2, 0ms};
    return {};
  }
};

// "record": notes the first float of each tensor it is called with, then changes that float in
// place. Each run of a duplicated request must still see the bytes that were sent.
struct first_values {
  std::mutex m;
  std::vector<float> seen;
  void serve_on(troupe::node& n) {
    n.functions().add("record", [this](troupe::tensor t) {
      auto* p = static_cast<float*>(t.data_ptr());
      {
        std::lock_guard<std::mutex> lock(m);
        seen.push_back(p[0]);
      }
      p[0] += 100;
      return 0;
    });
  }
  /// What was seen once `n` runs happened, or after 5 s.
  std::vector<float> after(std::size_t n) {
    const auto until = std::chrono::steady_clock::now() + 5s;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(m);
        if (seen.size() >= n || std::chrono::steady_clock::now() > until) return seen;
      }
      std::this_thread::sleep_for(1ms);
    }
  }
};

int open_sockets() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (auto* e = ::readdir(d)) {
      char target[256] = {};
      const std::string link = std::string("/proc/self/fd/") + e->d_name;
      const auto k = ::readlink(link.c_str(), target, sizeof target - 1);
      if (k > 0 && std::string(target, static_cast<std::size_t>(k)).rfind("socket:", 0) == 0) ++n;
    }
    ::closedir(d);
  }
  return n;
}

}  // namespace

TEST_CASE("tensors received as bytes keep value semantics and outlive their call and their nodes", "[actors][rpc]") {
  const int sockets_before = open_sockets();
  std::vector<troupe::tensor> results;
  std::vector<troupe::tensor> kept_by_callee;
  {
  auto hook = std::make_shared<duplicate_on_receive>();
  hook->function = "record";
  troupe::node n0(bytes_only(0, 0), {}, hook);
  troupe::node n1(bytes_only(1, n0.port()));
  // The callee changes its argument in place: the caller's tensor must not change, and each run of
  // a duplicated request must see the bytes that were sent.
  n0.functions().add("double_in_place", [](troupe::tensor t) {
    auto* p = static_cast<float*>(t.data_ptr());
    for (std::int64_t i = 0; i < t.numel(); ++i) p[i] *= 2;
    return t;
  });
  first_values recorded;
  recorded.serve_on(n0);
  n0.functions().add("keep", [&](troupe::tensor t) {
    kept_by_callee.push_back(t);  // a callee holding on to its argument
    return 0;
  });
  for (int k = 0; k < 4; ++k) {  // 6 MB: sent in fragments (Note [fragments]) and 1 MB: not
    const std::int64_t n = k % 2 == 0 ? (3 << 19) : (1 << 18);
    auto sent = pattern(n, static_cast<float>(10 * k));
    results.push_back(troupe::rpc_sync<troupe::tensor>(n1, "worker0", "double_in_place", sent));
    CHECK(has_pattern(sent, static_cast<float>(10 * k)));
  }
  // Each result is still intact after the calls that followed it (their payload buffers came
  // from the same pool): it holds its own.
  for (int k = 0; k < 4; ++k) {
    const auto* p = static_cast<const float*>(results[static_cast<std::size_t>(k)].data_ptr());
    bool ok = true;
    for (std::int64_t i = 0; i < results[static_cast<std::size_t>(k)].numel(); ++i)
      ok = ok && p[i] == 2 * (static_cast<float>(10 * k) + static_cast<float>(i % 1000));
    CHECK(ok);
  }
  CHECK(troupe::rpc_sync<int>(n1, "worker0", "record", pattern(1 << 18, 7.0f)) == 0);
  const auto seen = recorded.after(2);
  REQUIRE(seen.size() == 2);
  CHECK(seen[0] == 7.0f);
  CHECK(seen[1] == 7.0f);
  CHECK(troupe::rpc_sync<int>(n1, "worker0", "keep", pattern(1 << 18, 9.0f)) == 0);
  n1.shutdown(troupe::shutdown_mode::immediate);
  n0.shutdown(troupe::shutdown_mode::immediate);
  }
  // The nodes are gone; the tensors they received hold their bytes only (no socket, no node part).
  CHECK(open_sockets() == sockets_before);
  REQUIRE(results.size() == 4);
  for (int k = 0; k < 4; ++k) {
    const auto* p = static_cast<const float*>(results[static_cast<std::size_t>(k)].data_ptr());
    CHECK(p[1] == 2 * (static_cast<float>(10 * k) + 1.0f));
  }
  REQUIRE(kept_by_callee.size() == 1);
  CHECK(has_pattern(kept_by_callee[0], 9.0f));
}

TEST_CASE("large requests and responses to the node itself keep value semantics, after later calls and after the node is gone", "[actors][rpc]") {
  std::vector<troupe::tensor> results;
  std::vector<troupe::tensor> kept_by_callee;
  std::mutex m;
  first_values recorded;
  {
    auto hook = std::make_shared<duplicate_on_receive>();
    hook->function = "record";
    troupe::node n0(bytes_only(0, 0), {}, hook);  // calls to itself take its own direct channel
    n0.functions().add("echo", [](troupe::tensor t) { return t; });
    n0.functions().add("double_in_place", [](troupe::tensor t) {
      auto* p = static_cast<float*>(t.data_ptr());
      for (std::int64_t i = 0; i < t.numel(); ++i) p[i] *= 2;
      return t;
    });
    n0.functions().add("keep", [&](troupe::tensor t) {
      std::lock_guard<std::mutex> lock(m);
      kept_by_callee.push_back(t);
      return 0;
    });
    recorded.serve_on(n0);
    for (int k = 0; k < 3; ++k) {
      auto sent = pattern(1 << 18, static_cast<float>(k));
      results.push_back(troupe::rpc_sync<troupe::tensor>(n0, "worker0", "echo", sent));
      CHECK(has_pattern(sent, static_cast<float>(k)));
    }
    auto doubled_arg = pattern(1 << 18, 20.0f);
    const auto doubled = troupe::rpc_sync<troupe::tensor>(n0, "worker0", "double_in_place", doubled_arg);
    CHECK(has_pattern(doubled_arg, 20.0f));  // the callee changed its own copy only
    CHECK(static_cast<const float*>(doubled.data_ptr())[3] == 2 * 23.0f);
    for (int k = 0; k < 2; ++k) CHECK(troupe::rpc_sync<int>(n0, "worker0", "keep", pattern(1 << 18, 30.0f + static_cast<float>(k))) == 0);
    CHECK(troupe::rpc_sync<int>(n0, "worker0", "record", pattern(1 << 18, 7.0f)) == 0);
    recorded.after(2);
    n0.shutdown(troupe::shutdown_mode::immediate);
  }
  for (int k = 0; k < 3; ++k) CHECK(has_pattern(results[static_cast<std::size_t>(k)], static_cast<float>(k)));
  REQUIRE(kept_by_callee.size() == 2);  // each holds its own bytes, after later calls and the nodes
  CHECK(has_pattern(kept_by_callee[0], 30.0f));
  CHECK(has_pattern(kept_by_callee[1], 31.0f));
  const auto seen = recorded.after(2);
  REQUIRE(seen.size() == 2);  // both runs of a duplicated request see the bytes that were sent
  CHECK(seen[0] == 7.0f);
  CHECK(seen[1] == 7.0f);
}
