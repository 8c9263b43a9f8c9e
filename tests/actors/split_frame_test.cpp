// rpc/split_frame.hpp: a frame sent in three buffers (bytes before the payload, the payload, the
// bytes after it) is byte for byte the frame append_frame writes for the same message.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "rpc/split_frame.hpp"

namespace {

std::vector<char> bytes(std::size_t n, char seed) {
  std::vector<char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<char>(seed + i * 7);
  return v;
}

template <class T>
void check_same(T msg, troupe::detail::frame_kind kind) {
  std::vector<char> whole;
  REQUIRE(troupe::detail::append_frame(whole, kind, msg));
  troupe::detail::split_frame f;
  REQUIRE(troupe::detail::make_split_frame(f, kind, msg));
  CHECK(f.payload == &msg.payload);  // borrowed, not copied
  CHECK(f.flat() == whole);
  CHECK(f.size() == whole.size());
}

}  // namespace

TEST_CASE("a split frame is the same bytes as the whole frame, for every payload length encoding", "[actors][rpc]") {
  // Lengths around the 7-bit boundaries of the length prefix, and large ones.
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{127}, std::size_t{128}, std::size_t{16383}, std::size_t{16384},
                        std::size_t{65536}, std::size_t{(1 << 21) + 3}}) {
    INFO("payload bytes " << n);
    check_same(troupe::rpc_request{0x0102030405060708ULL, "echo", std::string(200, 'w'), bytes(n, 1), bytes(n % 300, 2)},
               troupe::detail::frame_kind::request);
    check_same(troupe::rpc_response{42, 3, "an error text", bytes(n, 5), {}}, troupe::detail::frame_kind::response);
  }
}

namespace {

// The body of `msg`'s whole frame, parsed both ways.
template <class T>
void check_parse(const T& msg, troupe::detail::frame_kind kind) {
  std::vector<char> whole;
  T copy = msg;
  REQUIRE(troupe::detail::append_frame(whole, kind, copy));
  const char* body = whole.data() + troupe::detail::frame_header_size;
  const std::size_t n = whole.size() - troupe::detail::frame_header_size;
  T by_caf, by_split;
  REQUIRE(troupe::detail::parse_body(body, n, by_caf));
  by_split.payload.reserve(msg.payload.size() + 64);  // a pooled buffer: its capacity is kept
  const auto* room = by_split.payload.data();
  REQUIRE(troupe::detail::parse_split_body(body, n, by_split));
  CHECK(by_split.payload.data() == room);
  CHECK(by_split.id == msg.id);
  CHECK(by_split.payload == msg.payload);
  CHECK(by_split.meta == msg.meta);
  CHECK(by_caf.payload == by_split.payload);
  // Cut short anywhere, or with a byte too many, it is malformed, as for parse_body.
  for (std::size_t cut : {std::size_t{1}, std::size_t{9}, n / 2, n - 1}) {
    T bad;
    CHECK_FALSE(troupe::detail::parse_split_body(body, cut, bad));
  }
  whole.push_back('x');
  T extra;
  CHECK_FALSE(troupe::detail::parse_split_body(whole.data() + troupe::detail::frame_header_size, n + 1, extra));
}

}  // namespace

TEST_CASE("a body parsed without the zero-fill gives what CAF's loader gives, and rejects what it rejects", "[actors][rpc]") {
  for (std::size_t n : {std::size_t{0}, std::size_t{127}, std::size_t{128}, std::size_t{65536}, std::size_t{(1 << 21) + 3}}) {
    INFO("payload bytes " << n);
    check_parse(troupe::rpc_request{7, "echo", "worker0", bytes(n, 3), bytes(n % 300, 4)}, troupe::detail::frame_kind::request);
    check_parse(troupe::rpc_response{9, 0, "", bytes(n, 6), bytes(17, 8)}, troupe::detail::frame_kind::response);
  }
}
