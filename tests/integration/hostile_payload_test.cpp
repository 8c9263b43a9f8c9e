// Bytes a peer crafts after it authenticated (Note [rpc payload] in rpc/codec.hpp, Note [bounded
// CAF reader]): each gets a clear troupe::error and the node that read them keeps serving. The
// bytes travel on real loopback connections between nodes: a transport hook of the sender
// rewrites a message after it was encoded (a payload, or a whole actor frame).
#include <caf/all.hpp>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <utility>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "sanitizer_build.hpp"
#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/remote_actor.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/transport.hpp"

using namespace std::chrono_literals;
using troupe::errc;

namespace {

// Rewrites the next message of a kind this node sends, once.
class rewriter final : public troupe::transport_hook {
 public:
  void arm(troupe::message_kind kind, std::function<void(std::vector<char>&)> fn) {
    std::lock_guard<std::mutex> lock(mutex_);
    kind_ = kind;
    fn_ = std::move(fn);
  }
  troupe::transport_decision on_send(troupe::envelope& m) override {
    std::function<void(std::vector<char>&)> fn;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!fn_ || m.kind != kind_) return {};
      fn = std::exchange(fn_, nullptr);
    }
    fn(m.payload);
    return {};
  }

 private:
  std::mutex mutex_;
  troupe::message_kind kind_ = troupe::message_kind::rpc_request;
  std::function<void(std::vector<char>&)> fn_;
};

// Says that everything from worker0 to worker1 is lost from the moment stall() was called on:
// a peer that stopped sending. worker1's node turns that into worker0's loss after the peer
// timeout (Note [silent peers]).
class staller final : public troupe::transport_hook {
 public:
  void stall() {
    std::lock_guard<std::mutex> lock(mutex_);
    since_ = std::chrono::steady_clock::now();
  }
  std::optional<std::chrono::steady_clock::time_point> silent_since(const std::string& from, const std::string& to) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (from != "worker0" || to != "worker1") return std::nullopt;
    return since_;
  }
  bool may_silence() const override { return true; }

 private:
  std::mutex mutex_;
  std::optional<std::chrono::steady_clock::time_point> since_;
};

// Three nodes in this process; worker0's sends pass `hook`; worker1 (whose hook is `hook1`, may
// be null) serves the functions and publishes an actor "sink".
struct three_nodes {
  std::shared_ptr<rewriter> hook = std::make_shared<rewriter>();
  std::unique_ptr<troupe::node> n0, n1, n2;
  caf::actor sink;
  explicit three_nodes(std::shared_ptr<troupe::transport_hook> hook1 = nullptr) {
    n0 = std::make_unique<troupe::node>(troupe::test::test_options(0, 3, 0, "hostile"), troupe::rpc::registry{}, hook);
    n1 = std::make_unique<troupe::node>(troupe::test::test_options(1, 3, n0->port(), "hostile"), troupe::rpc::registry{}, hook1);
    n2 = std::make_unique<troupe::node>(troupe::test::test_options(2, 3, n0->port(), "hostile"));
    n1->functions().add("add", [](int a, int b) { return a + b; });
    n1->functions().add("count", [] { return std::int64_t{7}; });
    n1->functions().add("flag", [](bool b) { return b ? 1 : 0; });
    n1->functions().add("rows", [](troupe::tensor t) { return t.sizes().at(0); });
    sink = n1->system().spawn([]() -> caf::behavior { return {[](std::int32_t x) { return x; }}; });
    troupe::publish_actor(*n1, sink, "sink");
  }
  ~three_nodes() {
    caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
    sink = nullptr;
    n2->shutdown(troupe::shutdown_mode::immediate);
    n1->shutdown(troupe::shutdown_mode::immediate);
    n0->shutdown(troupe::shutdown_mode::immediate);
  }
};

// The error of `call`, or a failure when it returned.
template <class F>
troupe::error error_of(F&& call) {
  try {
    call();
  } catch (const troupe::error& e) {
    return e;
  }
  FAIL("the call returned instead of failing");
  return troupe::error(errc::ok, "");
}

// Replaces the first occurrence of `from` in `bytes` by `to`; fails when it is not there.
void replace_bytes(std::vector<char>& bytes, const std::vector<char>& from, const std::vector<char>& to) {
  auto it = std::search(bytes.begin(), bytes.end(), from.begin(), from.end());
  REQUIRE(it != bytes.end());
  const auto at = it - bytes.begin();
  bytes.erase(it, it + static_cast<std::ptrdiff_t>(from.size()));
  bytes.insert(bytes.begin() + at, to.begin(), to.end());
}

template <class... T>
std::vector<char> raw(const T&... xs) {
  std::vector<char> out;
  (out.insert(out.end(), reinterpret_cast<const char*>(&xs), reinterpret_cast<const char*>(&xs) + sizeof xs), ...);
  return out;
}

void put_varint(std::vector<char>& out, std::uint64_t v) {
  do {
    out.push_back(static_cast<char>((v & 0x7f) | (v >= 0x80 ? 0x80 : 0)));
    v >>= 7;
  } while (v > 0);
}

// A request frame for "add" whose header announces a payload of `payload` bytes (and an empty
// meta after it), with only the first `sent` of them.
std::vector<char> announcing_frame(std::uint64_t payload, std::size_t sent) {
  std::vector<char> body(8, 0);
  for (const std::string s : {"add", "worker0"}) {
    put_varint(body, s.size());
    body.insert(body.end(), s.begin(), s.end());
  }
  put_varint(body, payload);
  const auto n = static_cast<std::uint32_t>(body.size() + payload + 1);
  body.resize(body.size() + sent, 'p');
  std::vector<char> frame{static_cast<char>(n), static_cast<char>(n >> 8), static_cast<char>(n >> 16), static_cast<char>(n >> 24), 0};
  frame.insert(frame.end(), body.begin(), body.end());
  return frame;
}

// Peak resident memory of this process since reset_peak(), in KiB.
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }
long peak_kib() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

// What AddressSanitizer itself touches for an allocation of `bytes` that nobody writes: its
// shadow, one byte per eight. Nothing without the sanitizer.
long shadow_kib(std::size_t bytes) { return troupe::test::under_asan ? static_cast<long>(bytes / 8 / 1024) : 0; }

}  // namespace

TEST_CASE("a tensor argument whose shape overflows int64 is refused and the callee keeps serving", "[actors][security]") {
  three_nodes t;
  // A [1, 4] float32 tensor's header, its first size made 2^62 + 1. The element count wraps to
  // 4 in 64 bits, so its 16 bytes would pass an unchecked product.
  t.hook->arm(troupe::message_kind::rpc_request, [](std::vector<char>& p) {
    replace_bytes(p, raw(std::int64_t{1}, std::int64_t{4}, std::uint64_t{16}),
                  raw((std::int64_t{1} << 62) + 1, std::int64_t{4}, std::uint64_t{16}));
  });
  const auto e = error_of([&] { (void)troupe::rpc_sync<std::int64_t>(*t.n0, "worker1", "rows", troupe::zeros({1, 4}), 10s); });
  CHECK(e.code() == errc::protocol_violation);
  CHECK_THAT(e.message(), Catch::Contains("4611686018427387905"));
  CHECK(troupe::rpc_sync<std::int64_t>(*t.n0, "worker1", "rows", troupe::zeros({3, 4}), 10s) == 3);
}

TEST_CASE("a bool argument holding the byte 2 is refused and the callee keeps serving", "[actors][security]") {
  three_nodes t;
  t.hook->arm(troupe::message_kind::rpc_request, [](std::vector<char>& p) {
    REQUIRE(p.back() == 1);
    p.back() = 2;
  });
  const auto e = error_of([&] { (void)troupe::rpc_sync<int>(*t.n0, "worker1", "flag", true, 10s); });
  CHECK(e.code() == errc::protocol_violation);
  CHECK_THAT(e.message(), Catch::Contains("bool") && Catch::Contains("2"));
  CHECK(troupe::rpc_sync<int>(*t.n0, "worker1", "flag", true, 10s) == 1);
}

TEST_CASE("a result asked for as another type is bad_argument naming both types", "[actors][security]") {
  three_nodes t;
  const auto e = error_of([&] { (void)troupe::rpc_sync<double>(*t.n0, "worker1", "count", 10s); });
  CHECK(e.code() == errc::bad_argument);
  CHECK_THAT(e.message(), Catch::Contains("float64") && Catch::Contains("int64") && Catch::Contains("count"));
  const auto b = error_of([&] { (void)troupe::rpc_sync<bool>(*t.n0, "worker1", "count", 10s); });
  CHECK(b.code() == errc::bad_argument);
  CHECK(troupe::rpc_sync<std::int64_t>(*t.n0, "worker1", "count", 10s) == 7);
}

TEST_CASE("a request frame announcing a 4 GiB meta allocates nothing and drops only its connection", "[actors][security]") {
  three_nodes t;
  CHECK(troupe::rpc_sync<int>(*t.n0, "worker1", "add", 1, 2, 10s) == 3);
  auto sink = troupe::lookup_actor(*t.n0, "worker1", "sink", 10s);
  // A whole request frame of 64 KiB and more, so the size is read in parts. It holds id,
  // function, caller, a 64 KiB payload, then a meta whose length says 4 GiB - 1 and whose bytes
  // are 4.
  t.hook->arm(troupe::message_kind::actor_message, [](std::vector<char>& frame) {
    std::vector<char> body(8, 0);
    for (const char* s : {"add", "worker0"}) {
      body.push_back(static_cast<char>(std::strlen(s)));
      body.insert(body.end(), s, s + std::strlen(s));
    }
    const char payload_len[] = {'\x80', '\x80', '\x04'};  // 65536
    body.insert(body.end(), payload_len, payload_len + 3);
    body.resize(body.size() + 65536, 0);
    const char meta_len[] = {'\xff', '\xff', '\xff', '\xff', '\x0f'};
    body.insert(body.end(), meta_len, meta_len + 5);
    body.insert(body.end(), {'m', 'e', 't', 'a'});
    const auto n = static_cast<std::uint32_t>(body.size());
    frame = {static_cast<char>(n), static_cast<char>(n >> 8), static_cast<char>(n >> 16), static_cast<char>(n >> 24), 0};
    frame.insert(frame.end(), body.begin(), body.end());
  });
  reset_peak();
  const long before = peak_kib();
  caf::anon_send(sink, std::int32_t{1});
  // worker1 drops the connection at the frame, before the call behind it on the same connection.
  const auto e = error_of([&] { (void)troupe::rpc_sync<int>(*t.n0, "worker1", "add", 2, 3, 10s); });
  CHECK(e.code() == errc::peer_lost);
  CHECK(peak_kib() - before < 256 * 1024);
  CHECK(troupe::rpc_sync<int>(*t.n2, "worker1", "add", 4, 5, 10s) == 9);  // worker1 still serves
}

TEST_CASE("an actor message whose tensor announces 4 GiB of bytes fails its request and allocates nothing", "[actors][security]") {
  three_nodes t;
  auto sink = troupe::lookup_actor(*t.n0, "worker1", "sink", 10s);
  const auto x = troupe::zeros({4});
  std::vector<char> encoded;
  troupe::rpc::detail::writer w(encoded);
  troupe::rpc::detail::write_tensor(w, x);
  REQUIRE(encoded.size() < 128);
  // The tensor's byte vector in the message: its one-byte length, made 4 GiB - 1.
  t.hook->arm(troupe::message_kind::actor_message, [&](std::vector<char>& frame) {
    std::vector<char> from{static_cast<char>(encoded.size())};
    from.insert(from.end(), encoded.begin(), encoded.end());
    std::vector<char> to{'\xff', '\xff', '\xff', '\xff', '\x0f'};
    to.insert(to.end(), encoded.begin(), encoded.end());
    replace_bytes(frame, from, to);
    const auto n = static_cast<std::uint32_t>(frame.size() - 5);
    for (int i = 0; i < 4; ++i) frame[static_cast<std::size_t>(i)] = static_cast<char>(n >> (8 * i));
  });
  reset_peak();
  const long before = peak_kib();
  caf::scoped_actor self{t.n0->system()};
  caf::error err;
  self->request(sink, 10s, x).receive([](troupe::tensor&) {}, [&](caf::error& e) { err = e; });
  REQUIRE(err);
  const auto e = troupe::from_caf_error(err, "request");
  CHECK(e.code() == errc::protocol_violation);
  CHECK_THAT(e.message(), Catch::Contains("cannot decode"));  // CAF's message loader drops the length error; nothing was allocated
  CHECK(peak_kib() - before < 256 * 1024);
  caf::error none;
  std::int32_t back = 0;
  self->request(sink, 10s, std::int32_t{5}).receive([&](std::int32_t v) { back = v; }, [&](caf::error& e) { none = e; });
  CHECK(!none);
  CHECK(back == 5);
}

TEST_CASE("a frame announcing 768 MiB of which a few bytes came commits no memory, and the stalled peer's connection is dropped", "[actors][security]") {
  auto stall = std::make_shared<staller>();
  three_nodes t(stall);
  CHECK(troupe::rpc_sync<int>(*t.n0, "worker1", "add", 1, 2, 10s) == 3);
  auto sink = troupe::lookup_actor(*t.n0, "worker1", "sink", 10s);
  // Note [direct fragment data]: worker1 reads such a frame straight into a buffer, which it must
  // not fill before the bytes come. worker0's next actor message becomes the frame.
  t.hook->arm(troupe::message_kind::actor_message, [](std::vector<char>& frame) { frame = announcing_frame(std::size_t{768} << 20, 1000); });
  reset_peak();
  const long before = peak_kib();
  caf::anon_send(sink, std::int32_t{1});
  stall->stall();  // worker0 sends nothing more that worker1 sees
  // The call's bytes go in the announced frame, so only the peer timeout ends it: worker1 loses
  // worker0 and drops its connections, and the call on the dropped one fails.
  const auto e = error_of([&] { (void)troupe::rpc_sync<int>(*t.n0, "worker1", "add", 2, 3, 10s); });
  CHECK(e.code() == errc::peer_lost);
  CHECK(peak_kib() - before < 64 * 1024 + shadow_kib(std::size_t{768} << 20));  // the buffer is reserved, never filled
  CHECK(troupe::rpc_sync<int>(*t.n2, "worker1", "add", 4, 5, 10s) == 9);  // worker1 still serves
}
