// Note [fragments] (actors/src/rpc/fragment.hpp): large frames of the direct channel go out in
// fragments that frames of other writers pass between, and come back together exactly; every
// malformed fragment is refused.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "actors/read_exact.hpp"

#include "rpc/byte_pool.hpp"
#include "rpc/channel_conn.hpp"
#include "rpc/fragment.hpp"
#include "rpc/split_frame.hpp"

using namespace troupe::detail;
using result = fragment_streams::result;

namespace {

constexpr auto request = static_cast<std::uint8_t>(frame_kind::request);
constexpr auto response = static_cast<std::uint8_t>(frame_kind::response);

std::vector<char> bytes(std::size_t n, unsigned seed) {
  std::vector<char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<char>(seed + i * 13 + (i >> 9));
  return v;
}

// A fragment's body (without its 5-byte frame header).
std::vector<char> frag(std::uint32_t stream, std::uint8_t flags, std::uint8_t inner, std::uint64_t total, const std::vector<char>& data) {
  unsigned char head[frame_header_size + fragment_head_size];
  write_fragment_head(head, fragment_head{stream, flags, inner, total}, data.size());
  std::vector<char> out(fragment_head_size + data.size());
  std::memcpy(out.data(), head + frame_header_size, fragment_head_size);
  if (!data.empty()) std::memcpy(out.data() + fragment_head_size, data.data(), data.size());
  return out;
}

// The inner frame's body, whichever way it was put together.
std::vector<char> joined(const fragment_streams::assembled& a) {
  std::vector<char> all = a.head;
  all.insert(all.end(), a.rest.begin(), a.rest.end());
  return all;
}

result add(fragment_streams& s, const std::vector<char>& body, std::vector<char>& whole, std::uint8_t want = request) {
  fragment_streams::assembled a;
  const result r = s.add(body.data(), body.size(), want, nullptr, a);
  if (r == result::complete) whole = joined(a);
  return r;
}

// Frames read from `fd` until `stop` says so: kind and body of each.
struct frame {
  std::uint8_t kind;
  std::vector<char> body;
};
using troupe::test::read_exact;
bool read_frame(int fd, frame& f) {
  char head[frame_header_size];
  if (!read_exact(fd, head, sizeof head)) return false;
  f.kind = static_cast<std::uint8_t>(head[4]);
  f.body.resize(frame_length(head));
  return read_exact(fd, f.body.data(), f.body.size());
}

struct socket_pair {
  int fds[2] = {-1, -1};
  socket_pair() {
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    timeval bound{10, 0};  // every read is bounded: a frame that never comes fails the test
    ::setsockopt(fds[1], SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
  }
  ~socket_pair() {
    if (fds[1] >= 0) ::close(fds[1]);
  }
};

// A whole frame (header + body) as three buffers, like a split frame: head, payload, tail.
struct three_parts {
  std::vector<char> head, payload, tail;
  std::vector<channel_conn::part> parts() const {
    return {{head.data(), head.size()}, {payload.data(), payload.size()}, {tail.data(), tail.size()}};
  }
  std::vector<char> body() const {
    std::vector<char> b(head.begin() + frame_header_size, head.end());
    b.insert(b.end(), payload.begin(), payload.end());
    b.insert(b.end(), tail.begin(), tail.end());
    return b;
  }
};
three_parts make_frame(std::size_t payload, unsigned seed) {
  three_parts f{bytes(frame_header_size + 37, seed), bytes(payload, seed + 1), bytes(11, seed + 2)};
  const auto len = static_cast<std::uint32_t>(37 + payload + 11);
  std::memcpy(f.head.data(), &len, 4);  // little endian, as on the machines we run on
  f.head[4] = static_cast<char>(frame_kind::response);
  return f;
}

}  // namespace

TEST_CASE("fragments written by write_fragmented come back together as the frame's body, at every size boundary", "[actors][rpc]") {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, fragment_bytes - 48, fragment_bytes, fragment_bytes + 1, 3 * fragment_bytes + 17}) {
    INFO("payload bytes " << n);
    socket_pair sp;
    const auto f = make_frame(n, static_cast<unsigned>(n));
    std::thread writer([&] {
      channel_conn c(sp.fds[0], true);
      const auto parts = f.parts();
      CHECK(c.write_fragmented(parts.data(), parts.size()));
    });
    fragment_streams streams;
    std::vector<char> whole;
    std::size_t fragments = 0;
    for (result r = result::partial; r == result::partial;) {
      frame fr;
      REQUIRE(read_frame(sp.fds[1], fr));
      REQUIRE(fr.kind == static_cast<std::uint8_t>(frame_kind::fragment));
      CHECK(fr.body.size() <= fragment_head_size + fragment_bytes);
      ++fragments;
      r = add(streams, fr.body, whole, response);
      REQUIRE(r != result::malformed);
    }
    writer.join();
    CHECK(whole == f.body());
    CHECK(fragments == std::max<std::size_t>(1, (f.body().size() + fragment_bytes - 1) / fragment_bytes));
    CHECK(streams.open() == 0);
  }
}

TEST_CASE("a small frame written while a large one goes out in fragments arrives before the large one's last fragment", "[actors][rpc]") {
  socket_pair sp;
  channel_conn c(sp.fds[0], true);
  const auto big = make_frame(16 * fragment_bytes, 3);
  std::atomic<bool> first_read{false};
  std::thread large([&] {
    const auto parts = big.parts();
    CHECK(c.write_fragmented(parts.data(), parts.size()));
  });
  std::thread small([&] {
    while (!first_read) std::this_thread::yield();
    const char tiny[frame_header_size + 3] = {3, 0, 0, 0, static_cast<char>(frame_kind::response), 'a', 'b', 'c'};
    CHECK(c.write(tiny, sizeof tiny));
  });
  std::vector<frame> got;
  fragment_streams streams;
  std::vector<char> whole;
  bool done = false;
  while (!done) {
    frame fr;
    REQUIRE(read_frame(sp.fds[1], fr));
    if (got.empty()) {
      first_read = true;  // the large writer is now blocked on a full socket, or about to be
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (fr.kind == static_cast<std::uint8_t>(frame_kind::fragment)) {
      const auto r = add(streams, fr.body, whole, response);
      REQUIRE(r != result::malformed);
      done = r == result::complete;
    }
    got.push_back(std::move(fr));
  }
  large.join();
  small.join();
  CHECK(whole == big.body());
  std::size_t small_at = got.size();
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i].kind == static_cast<std::uint8_t>(frame_kind::response)) small_at = i;
  INFO("the small frame came as frame " << small_at << " of " << got.size());
  CHECK(small_at < got.size() - 1);  // before the last fragment (it was read, too)
  CHECK(small_at <= 4);              // after at most the fragments already under way
}

TEST_CASE("a fragment waits for a writer that is flushing instead of leaving all its bytes to it", "[actors][rpc]") {
  // Otherwise a small writer that happened to be flushing sent every later fragment of the large
  // frame, and its own call took the whole transfer.
  socket_pair sp;
  channel_conn c(sp.fds[0], true);
  const auto blob = bytes(std::size_t{1} << 20, 9);  // fills the socket: its writer blocks, flushing
  std::vector<char> one(frame_header_size + blob.size());
  const auto blen = static_cast<std::uint32_t>(blob.size());
  std::memcpy(one.data(), &blen, 4);
  one[4] = static_cast<char>(frame_kind::response);
  std::memcpy(one.data() + frame_header_size, blob.data(), blob.size());
  std::atomic<bool> flushing_started{false}, first_returned{false};
  std::thread first([&] {
    flushing_started = true;
    CHECK(c.write(one.data(), one.size()));
    first_returned = true;
  });
  const auto big = make_frame(32 * fragment_bytes, 5);
  std::thread large([&] {
    while (!flushing_started) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the first writer is blocked by now
    const auto parts = big.parts();
    CHECK(c.write_fragmented(parts.data(), parts.size()));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::size_t read_bytes = 0, read_when_returned = 0;
  fragment_streams streams;
  std::vector<char> whole;
  for (bool done = false; !done;) {
    frame fr;
    REQUIRE(read_frame(sp.fds[1], fr));
    read_bytes += frame_header_size + fr.body.size();
    if (fr.kind == static_cast<std::uint8_t>(frame_kind::fragment)) {
      done = add(streams, fr.body, whole, response) == result::complete;
    } else {
      CHECK(fr.body == blob);
      // Stop reading until the first writer returns: it can only if it left the large frame's
      // fragments to their writer (sending them itself, it would block on the full socket).
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (!first_returned && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (first_returned) read_when_returned = read_bytes;
    }
  }
  first.join();
  large.join();
  CHECK(whole == big.body());
  INFO("bytes read when the first writer returned: " << read_when_returned);
  CHECK(read_when_returned > 0);
  CHECK(read_when_returned < (std::size_t{3} << 20));  // not after the large frame's 8 MiB
}

TEST_CASE("interleaved streams come back together each on its own", "[actors][rpc]") {
  fragment_streams s;
  std::vector<char> whole;
  const auto a = bytes(30, 1), b = bytes(20, 2);
  CHECK(add(s, frag(7, fragment_first, request, 30, {a.begin(), a.begin() + 10}), whole) == result::partial);
  CHECK(add(s, frag(9, fragment_first, request, 20, {b.begin(), b.begin() + 5}), whole) == result::partial);
  CHECK(s.open() == 2);
  CHECK(add(s, frag(7, 0, request, 30, {a.begin() + 10, a.begin() + 20}), whole) == result::partial);
  CHECK(add(s, frag(9, fragment_last, request, 20, {b.begin() + 5, b.end()}), whole) == result::complete);
  CHECK(whole == b);
  CHECK(add(s, frag(7, fragment_last, request, 30, {a.begin() + 20, a.end()}), whole) == result::complete);
  CHECK(whole == a);
  CHECK(s.open() == 0);
  // One fragment that is first and last at once.
  CHECK(add(s, frag(1, fragment_first | fragment_last, request, 30, a), whole) == result::complete);
  CHECK(whole == a);
}

TEST_CASE("malformed fragments are refused", "[actors][rpc]") {
  std::vector<char> whole;
  const auto d = bytes(10, 3);
  SECTION("too short for its fields") {
    fragment_streams s;
    auto f = frag(1, fragment_first, request, 10, d);
    f.resize(fragment_head_size - 1);
    CHECK(add(s, f, whole) == result::malformed);
  }
  SECTION("an inner kind the connection does not take") {
    fragment_streams s;
    CHECK(add(s, frag(1, fragment_first, response, 10, d), whole) == result::malformed);
    CHECK(add(s, frag(1, fragment_first, static_cast<std::uint8_t>(frame_kind::auth), 10, d), whole) == result::malformed);
    CHECK(add(s, frag(1, fragment_first, static_cast<std::uint8_t>(frame_kind::fragment), 10, d), whole) == result::malformed);
    CHECK(add(s, frag(1, fragment_first, request, 10, d), whole, response) == result::malformed);
  }
  SECTION("a total beyond the largest frame") {
    fragment_streams s;
    CHECK(add(s, frag(1, fragment_first, request, std::uint64_t{max_frame_body} + 1, d), whole) == result::malformed);
  }
  SECTION("a later fragment of a stream that never began") {
    fragment_streams s;
    CHECK(add(s, frag(4, 0, request, 20, d), whole) == result::malformed);
    CHECK(add(s, frag(4, fragment_last, request, 10, d), whole) == result::malformed);
  }
  SECTION("a stream begun twice") {
    fragment_streams s;
    CHECK(add(s, frag(4, fragment_first, request, 20, d), whole) == result::partial);
    CHECK(add(s, frag(4, fragment_first, request, 20, d), whole) == result::malformed);
  }
  SECTION("a total that changes between fragments") {
    fragment_streams s;
    CHECK(add(s, frag(4, fragment_first, request, 30, d), whole) == result::partial);
    CHECK(add(s, frag(4, 0, request, 31, d), whole) == result::malformed);
  }
  SECTION("more bytes than announced") {
    fragment_streams s;
    CHECK(add(s, frag(4, fragment_first, request, 15, d), whole) == result::partial);
    CHECK(add(s, frag(4, 0, request, 15, d), whole) == result::malformed);
    CHECK(s.open() == 0);
  }
  SECTION("a last fragment that leaves the body short") {
    fragment_streams s;
    CHECK(add(s, frag(4, fragment_first, request, 30, d), whole) == result::partial);
    CHECK(add(s, frag(4, fragment_last, request, 30, d), whole) == result::malformed);
    CHECK(s.open() == 0);
  }
  SECTION("too many streams at once") {
    fragment_streams s;
    for (std::uint32_t i = 0; i < max_open_streams; ++i) REQUIRE(add(s, frag(i, fragment_first, request, 20, d), whole) == result::partial);
    CHECK(add(s, frag(999999, fragment_first, request, 20, d), whole) == result::malformed);
  }
  SECTION("too many bytes announced at once") {
    fragment_streams s;
    const std::uint64_t each = max_frame_body;
    std::uint32_t i = 0;
    for (; (i + 1) * each <= max_open_bytes; ++i) REQUIRE(add(s, frag(i, fragment_first, request, each, d), whole) == result::partial);
    CHECK(add(s, frag(i, fragment_first, request, each, d), whole) == result::malformed);
  }
}

TEST_CASE("a fragmented request comes back as the same message, its payload in the pooled buffer it was put together in", "[actors][rpc]") {
  troupe::rpc_request msg{42, "echo", "worker0", bytes(byte_pool_min_bytes + 1000, 6), bytes(33, 7)};
  std::vector<char> frame;
  REQUIRE(append_frame(frame, frame_kind::request, msg));
  std::vector<char> body(frame.begin() + frame_header_size, frame.end());
  byte_pool pool;
  std::vector<char> kept;
  kept.reserve(byte_pool_min_bytes * 2);
  const char* room = kept.data();
  pool.give(std::move(kept));
  fragment_streams s;
  fragment_streams::assembled a;
  const std::uint64_t total = body.size();
  const std::size_t cut = 5000;  // the head, and some of the payload, in the first fragment
  const auto first = frag(3, fragment_first, request, total, {body.begin(), body.begin() + cut});
  REQUIRE(s.add(first.data(), first.size(), request, &pool, a) == result::partial);
  CHECK(pool.kept_buffers() == 0);
  const auto last = frag(3, fragment_last, request, total, {body.begin() + cut, body.end()});
  REQUIRE(s.add(last.data(), last.size(), request, &pool, a) == result::complete);
  CHECK(a.inner == request);
  REQUIRE_FALSE(a.head.empty());
  CHECK(joined(a) == body);
  troupe::rpc_request got;
  REQUIRE(parse_split_parts(a.head, std::move(a.rest), got));
  CHECK(got.payload.data() == room);  // no copy after the fragments
  CHECK(got.id == msg.id);
  CHECK(got.function == msg.function);
  CHECK(got.caller == msg.caller);
  CHECK(got.payload == msg.payload);
  CHECK(got.meta == msg.meta);
}

TEST_CASE("a first fragment too short for the head puts the whole body together, and a bad tail is refused", "[actors][rpc]") {
  troupe::rpc_response msg{7, 0, std::string(300, 'm'), bytes(5000, 8), bytes(9, 9)};
  std::vector<char> frame;
  REQUIRE(append_frame(frame, frame_kind::response, msg));
  std::vector<char> body(frame.begin() + frame_header_size, frame.end());
  fragment_streams s;
  fragment_streams::assembled a;
  const auto first = frag(1, fragment_first, response, body.size(), {body.begin(), body.begin() + 100});  // mid-message
  REQUIRE(s.add(first.data(), first.size(), response, nullptr, a) == result::partial);
  const auto last = frag(1, fragment_last, response, body.size(), {body.begin() + 100, body.end()});
  REQUIRE(s.add(last.data(), last.size(), response, nullptr, a) == result::complete);
  CHECK(a.head.empty());
  CHECK(a.rest == body);
  // A head whose payload is longer than what follows it, or a tail with a byte too many.
  const auto whole = frag(2, fragment_first | fragment_last, response, body.size(), body);
  REQUIRE(s.add(whole.data(), whole.size(), response, nullptr, a) == result::complete);
  REQUIRE_FALSE(a.head.empty());
  troupe::rpc_response bad;
  auto rest = a.rest;
  rest.resize(rest.size() - 12);
  CHECK_FALSE(parse_split_parts(a.head, std::move(rest), bad));
  rest = a.rest;
  rest.push_back('x');
  CHECK_FALSE(parse_split_parts(a.head, std::move(rest), bad));
  troupe::rpc_response good;
  REQUIRE(parse_split_parts(a.head, std::move(a.rest), good));
  CHECK(good.message == msg.message);
  CHECK(good.payload == msg.payload);
  CHECK(good.meta == msg.meta);
}

namespace {

// Note [direct fragment data]: the rest of `body` from `have` on written to direct_target() in
// reads of 1/`part` of what is left, as a reader does.
void read_rest(fragment_streams& s, const std::vector<char>& body, std::size_t have, std::size_t part) {
  std::size_t at = have;
  while (s.direct_left() > 0) {
    const std::size_t k = std::min(s.direct_room(), std::max<std::size_t>(1, s.direct_left() / part));
    std::memcpy(s.direct_target(), body.data() + at, k);
    s.direct_advance(k);
    at += k;
  }
  REQUIRE(at == body.size());
}

// A later fragment given to start_direct with its first `have` body bytes, the rest then read.
result direct(fragment_streams& s, const std::vector<char>& body, std::size_t have, std::vector<char>& whole, std::uint8_t want = request) {
  const result r = s.start_direct(body.data(), have, body.size(), want);
  if (r != result::partial) return r;
  read_rest(s, body, have, 2);
  REQUIRE(s.direct_done());
  fragment_streams::assembled a;
  const result done = s.finish_direct(a);
  if (done == result::complete) whole = joined(a);
  CHECK_FALSE(s.direct_done());
  return done;
}

}  // namespace

TEST_CASE("later fragments read straight into their stream come back together as the same body, whatever part of them came first", "[actors][rpc]") {
  const auto b = bytes(1000, 3);
  const std::uint64_t total = b.size();
  const std::vector<char> first(b.begin(), b.begin() + 100), middle(b.begin() + 100, b.begin() + 700), last(b.begin() + 700, b.end());
  for (std::size_t extra : {std::size_t{0}, std::size_t{1}, std::size_t{299}, std::size_t{599}}) {
    INFO("data bytes read with the head " << extra);
    fragment_streams s;
    std::vector<char> whole;
    REQUIRE(add(s, frag(5, fragment_first, request, total, first), whole) == result::partial);
    const auto mid = frag(5, 0, request, total, middle);
    CHECK(direct(s, mid, fragment_head_size + extra, whole) == result::partial);
    const auto end = frag(5, fragment_last, request, total, last);
    CHECK(direct(s, end, fragment_head_size + std::min<std::size_t>(extra, last.size() - 1), whole) == result::complete);
    CHECK(whole == b);
    CHECK(s.open() == 0);
  }
}

TEST_CASE("a stream put together in a pooled buffer that held other bytes before has exactly its own bytes", "[actors][rpc]") {
  byte_pool pool;
  const auto b = bytes((std::size_t{4} << 20) + 3 * fragment_bytes + 7, 9);
  std::vector<char> old(b.size() * 2, 'x');  // given back with its size: contents stale
  pool.give(std::move(old));
  const std::uint64_t total = b.size();
  fragment_streams s;
  fragment_streams::assembled a;
  const std::vector<char> head(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(fragment_bytes));
  REQUIRE(s.add(frag(2, fragment_first, request, total, head).data(), fragment_head_size + head.size(), request, &pool, a) == result::partial);
  CHECK(pool.kept_buffers() == 0);  // the stream took it
  std::vector<char> whole;
  for (std::size_t at = fragment_bytes; at < b.size(); at += fragment_bytes) {
    const std::size_t n = std::min(fragment_bytes, b.size() - at);
    const std::vector<char> data(b.begin() + static_cast<std::ptrdiff_t>(at), b.begin() + static_cast<std::ptrdiff_t>(at + n));
    const bool is_last = at + n == b.size();
    CHECK(direct(s, frag(2, is_last ? fragment_last : 0, request, total, data), fragment_head_size + 3, whole) ==
          (is_last ? result::complete : result::partial));
  }
  CHECK(whole == b);
}

TEST_CASE("a fragment read straight into its stream is checked as add checks it", "[actors][rpc]") {
  const auto d = bytes(10, 1);
  std::vector<char> whole;
  auto opened = [&](fragment_streams& s) { REQUIRE(add(s, frag(4, fragment_first, request, 30, d), whole) == result::partial); };
  SECTION("a first fragment is left to be read whole") {
    fragment_streams s;
    const auto f = frag(4, fragment_first, request, 30, d);
    CHECK(s.start_direct(f.data(), fragment_head_size, f.size(), request) == result::wait_whole);
    CHECK(s.direct_left() == 0);
  }
  SECTION("a stream never opened") {
    fragment_streams s;
    CHECK(direct(s, frag(4, 0, request, 30, d), fragment_head_size, whole) == result::malformed);
  }
  SECTION("another total than its first fragment's") {
    fragment_streams s;
    opened(s);
    CHECK(direct(s, frag(4, 0, request, 31, d), fragment_head_size, whole) == result::malformed);
  }
  SECTION("more bytes than announced") {
    fragment_streams s;
    opened(s);
    CHECK(direct(s, frag(4, 0, request, 30, bytes(21, 2)), fragment_head_size, whole) == result::malformed);
    CHECK(s.open() == 0);
    CHECK(s.direct_left() == 0);
  }
  SECTION("a last fragment that leaves the body short") {
    fragment_streams s;
    opened(s);
    CHECK(direct(s, frag(4, fragment_last, request, 30, d), fragment_head_size, whole) == result::malformed);
    CHECK(s.open() == 0);
  }
  SECTION("an inner kind the reader does not take") {
    fragment_streams s;
    opened(s);
    CHECK(direct(s, frag(4, 0, response, 30, d), fragment_head_size, whole) == result::malformed);
  }
}

namespace {
// A connected TCP pair on loopback: [0] the connecting end, [1] the accepted one.
struct tcp_pair {
  int fds[2] = {-1, -1};
  tcp_pair() {
    const int l = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    REQUIRE(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(l, 1) == 0);
    REQUIRE(::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    fds[0] = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(::connect(fds[0], reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    fds[1] = ::accept(l, nullptr, nullptr);
    ::close(l);
    REQUIRE(fds[1] >= 0);
    timeval bound{10, 0};
    ::setsockopt(fds[1], SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
  }
  ~tcp_pair() {
    if (fds[1] >= 0) ::close(fds[1]);
  }
};
int unsent_mark(int fd) {
  int v = -1;
  socklen_t n = sizeof v;
  ::getsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, &n);
  return v;
}
}  // namespace

TEST_CASE("the socket keeps few unsent bytes while fragments go out, and none is imposed on whole frames", "[actors][rpc]") {
  tcp_pair tp;
  channel_conn c(tp.fds[0], true);
  CHECK(unsent_mark(c.fd()) == 0);  // the system's default: no mark
  const auto whole_frame = make_frame(fragment_bytes, 4);  // under fragment_min_bytes: written whole
  const auto wp = whole_frame.parts();
  REQUIRE(c.write_parts(wp.data(), wp.size()));
  frame fr;
  REQUIRE(read_frame(tp.fds[1], fr));
  CHECK(unsent_mark(c.fd()) == 0);
  // 64 MB cannot all sit in the socket buffers: the writer is still at work after the first fragment.
  const auto big = make_frame(256 * fragment_bytes, 5);
  std::thread large([&] {
    const auto parts = big.parts();
    CHECK(c.write_fragmented(parts.data(), parts.size()));
  });
  REQUIRE(read_frame(tp.fds[1], fr));
  CHECK(unsent_mark(c.fd()) == unsent_low_water);
  fragment_streams streams;
  std::vector<char> whole;
  for (result r = add(streams, fr.body, whole, response); r == result::partial; r = add(streams, fr.body, whole, response))
    REQUIRE(read_frame(tp.fds[1], fr));
  large.join();
  CHECK(whole == big.body());
  CHECK(unsent_mark(c.fd()) == 0);
}

TEST_CASE("a large response read straight into its payload buffer comes back as the same message, wherever the first read ended", "[actors][rpc]") {
  troupe::rpc_response msg{9, 0, "fine", bytes(300000, 4), bytes(21, 5)};
  std::vector<char> frame;
  REQUIRE(append_frame(frame, frame_kind::response, msg));
  const std::vector<char> body(frame.begin() + frame_header_size, frame.end());
  std::size_t head = 0, payload = 0;
  REQUIRE(split_head_size<troupe::rpc_response>(body.data(), body.size(), head, payload));
  for (std::size_t have : {head, head + 1, head + 70000, body.size() - 1}) {
    INFO("bytes read with the head " << have);
    byte_pool pool;
    std::vector<char> stale(2 * body.size(), 'x');  // a pooled buffer that held other bytes
    const char* room = stale.data();
    pool.give(std::move(stale));
    fragment_streams s;
    REQUIRE(s.start_frame(body.data(), have, body.size(), response, &pool) == result::partial);
    read_rest(s, body, have, 3);
    REQUIRE(s.direct_done());
    fragment_streams::assembled a;
    REQUIRE(s.finish_direct(a) == result::complete);
    CHECK_FALSE(s.direct_done());
    CHECK(a.inner == response);
    CHECK(joined(a) == body);
    troupe::rpc_response got;
    REQUIRE(parse_split_parts(a.head, std::move(a.rest), got));
    CHECK(got.payload.data() == room);  // read into the pooled buffer, not copied after
    CHECK(got.id == msg.id);
    CHECK(got.message == msg.message);
    CHECK(got.payload == msg.payload);
    CHECK(got.meta == msg.meta);
  }
}

TEST_CASE("a large frame whose head is not all read yet, or is not a message's, is left to be read whole", "[actors][rpc]") {
  troupe::rpc_request msg{3, "f", "worker0", bytes(100000, 2), {}};
  std::vector<char> frame;
  REQUIRE(append_frame(frame, frame_kind::request, msg));
  const std::vector<char> body(frame.begin() + frame_header_size, frame.end());
  fragment_streams s;
  CHECK(s.start_frame(body.data(), 3, body.size(), request, nullptr) == result::wait_whole);  // mid-head
  std::size_t head = 0, payload = 0;
  REQUIRE(split_head_size<troupe::rpc_request>(body.data(), body.size(), head, payload));
  // A frame that announces fewer bytes than its payload's length prefix says.
  CHECK(s.start_frame(body.data(), head + 10, head + payload - 1, request, nullptr) == result::wait_whole);
  CHECK(s.direct_left() == 0);
  CHECK_FALSE(s.direct_done());
}
