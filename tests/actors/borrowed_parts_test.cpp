// Note [borrowed tensor bytes] (rpc/borrowed_parts.hpp): an encode that borrows leaves large
// inline tensors out of its buffer, and the frame it makes is the frame of the copying encode.
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "actors/read_exact.hpp"

#include "rpc/borrowed_parts.hpp"
#include "rpc/channel_conn.hpp"
#include "rpc/fragment.hpp"
#include "rpc/frame_sender.hpp"
#include "rpc/split_frame.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/tensors/factories.hpp"

namespace {

using troupe::rpc::detail::borrowed_parts;

troupe::tensor bytes_of(std::int64_t n, unsigned seed) {
  auto t = troupe::empty({n}, troupe::tensor_options{troupe::dtype::uint8});
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<unsigned char>((i * 131 + seed * 7919 + (i >> 12)) & 0xff);
  return t;
}

bool same(const troupe::tensor& a, const troupe::tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// What rpc_async's encode does (Note [borrowed tensor bytes]): the payload's own encode borrows.
template <class... Args>
std::vector<char> encode_borrowing(borrowed_parts& gather, const Args&... args) {
  troupe::rpc::codec_context ctx;
  ctx.gather = &gather;
  ctx.borrow = true;
  return troupe::rpc::encode_args(ctx, args...);
}

using troupe::test::read_exact;

// Reads fragments from `fd` until a request is whole (Note [fragments]); false on a read error.
bool read_fragmented_request(int fd, troupe::rpc_request& out) {
  namespace d = troupe::detail;
  d::fragment_streams streams;
  for (;;) {
    char head[d::frame_header_size];
    if (!read_exact(fd, head, sizeof head)) return false;
    std::vector<char> body(d::frame_length(head));
    if (!read_exact(fd, body.data(), body.size())) return false;
    if (head[4] != static_cast<char>(d::frame_kind::fragment)) return false;
    d::fragment_streams::assembled a;
    const auto r = streams.add(body.data(), body.size(), static_cast<std::uint8_t>(d::frame_kind::request), nullptr, a);
    if (r == d::fragment_streams::result::partial) continue;
    if (r != d::fragment_streams::result::complete) return false;
    return a.head.empty() ? d::parse_body(a.rest.data(), a.rest.size(), out) : d::parse_split_parts(a.head, std::move(a.rest), out);
  }
}

}  // namespace

TEST_CASE("an argument list that borrows its large tensors is, flattened, the bytes of the copying encode", "[actors][codec]") {
  const auto a = bytes_of((1 << 20) + 3, 1);   // borrowed
  const auto b = bytes_of(300 << 10, 2);       // borrowed, after an odd-sized one: its padding counts the first
  const auto small = bytes_of(1000, 3);        // under borrow_min_bytes: copied
  const std::string s = "between";
  borrowed_parts gather;
  auto buffer = encode_borrowing(gather, std::int32_t{7}, a, s, b, small);
  REQUIRE(gather.parts().size() == 2);
  CHECK(gather.bytes() == a.nbytes() + b.nbytes());
  CHECK(buffer.size() < 4096);  // no tensor byte of the two large ones was copied
  CHECK(gather.parts()[0].keep.data_ptr() == a.data_ptr());  // their own storage
  CHECK(gather.parts()[1].keep.data_ptr() == b.data_ptr());
  const auto plain = troupe::rpc::encode_args(std::int32_t{7}, a, s, b, small);
  gather.flatten_into(buffer);
  CHECK(gather.empty());
  CHECK(buffer == plain);
}

TEST_CASE("an encode that is not the payload's own copies its tensors even when the sender gathers", "[actors][codec]") {
  const auto a = bytes_of(1 << 20, 4);
  borrowed_parts gather;
  troupe::rpc::codec_context ctx;
  ctx.gather = &gather;  // offered, not taken: a nested payload (an rref's remote call) reads its buffer whole
  const auto bytes = troupe::rpc::encode_args(ctx, a);
  CHECK(gather.empty());
  CHECK(bytes == troupe::rpc::encode_args(a));
}

TEST_CASE("a borrowed part keeps its tensor's storage until it is cleared", "[actors][codec]") {
  std::weak_ptr<troupe::storage> alive;
  borrowed_parts gather;
  {
    const auto a = bytes_of(1 << 20, 5);
    alive = a.storage();
    encode_borrowing(gather, a);
  }
  CHECK_FALSE(alive.expired());
  gather.clear();
  CHECK(alive.expired());
}

TEST_CASE("a split frame gathering borrowed tensors is the frame of the flattened message, and parses back", "[actors][codec]") {
  const auto a = bytes_of((2 << 20) + 17, 6);
  borrowed_parts gather;
  troupe::rpc_request req{42, "echo", "worker0", encode_borrowing(gather, a, std::string("x")), {'m'}};
  troupe::detail::split_frame f;
  REQUIRE(troupe::detail::make_split_frame(f, troupe::detail::frame_kind::request, req, troupe::detail::max_frame_body, &gather));
  const auto wire = f.flat();

  troupe::rpc_request whole = req;
  borrowed_parts copy_of;  // flatten a second list over the same tensors: `gather` stays with the frame
  copy_of.add(gather.parts()[0].at, gather.parts()[0].keep);
  copy_of.flatten_into(whole.payload);
  std::vector<char> expected;
  REQUIRE(troupe::detail::append_frame(expected, troupe::detail::frame_kind::request, whole));
  CHECK(wire == expected);

  troupe::rpc_request back;
  REQUIRE(troupe::detail::parse_body(wire.data() + troupe::detail::frame_header_size, wire.size() - troupe::detail::frame_header_size, back));
  const auto [t, s] = troupe::rpc::decode_args<troupe::tensor, std::string>(back.payload, "echo");
  CHECK(same(t, a));
  CHECK(s == "x");
}

TEST_CASE("a request that borrows a tensor is written before send_large returns, and the tensor is free and may change then", "[actors][rpc]") {
  int fds[2] = {-1, -1};
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  const timeval bound{10, 0};  // a frame that never comes fails the test
  ::setsockopt(fds[1], SOL_SOCKET, SO_RCVTIMEO, &bound, sizeof bound);
  auto conn = std::make_shared<troupe::detail::channel_conn>(fds[0], true);  // owns fds[0]
  troupe::detail::frame_sender sender(nullptr, troupe::detail::max_frame_body, [](auto, auto) {});

  auto t = bytes_of((8 << 20) + 5, 9);  // fragmented: larger than fragment_min_bytes
  const auto original = bytes_of((8 << 20) + 5, 9);
  borrowed_parts gather;
  troupe::rpc_request req{5, "f", "worker0", encode_borrowing(gather, t), {}};
  REQUIRE(gather.parts().size() == 1);
  troupe::rpc_request got;
  bool read_ok = false;
  std::thread reader([&] { read_ok = read_fragmented_request(fds[1], got); });
  const bool sent = sender.send_large(conn, troupe::detail::frame_kind::request, std::move(req), troupe::transport_decision{},
                                      std::move(gather));
  CHECK(t.impl().use_count() == 1);             // the send let the tensor go
  std::memset(t.data_ptr(), 0x5a, t.nbytes());  // and it may change at once
  reader.join();
  sender.stop();
  ::close(fds[1]);
  REQUIRE(sent);
  REQUIRE(read_ok);
  CHECK(got.id == 5);
  const auto back = std::get<0>(troupe::rpc::decode_args<troupe::tensor>(got.payload, "f"));
  CHECK(same(back, original));
}
