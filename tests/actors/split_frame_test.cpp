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
