// Note [frame codec] (rpc/wire.hpp): requests and responses are written and read without CAF's
// serializer, in exactly CAF's bytes. So the two can be mixed: the split large-payload paths,
// and any peer that uses CAF's own loader.
#include <catch2/catch.hpp>

#include <cstring>
#include <string>
#include <vector>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include "rpc/wire.hpp"

namespace {

using troupe::detail::frame_header_size;
using troupe::detail::frame_kind;

std::vector<char> bytes(std::size_t n, char seed) {
  std::vector<char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<char>(seed + i * 13);
  return v;
}

// The frame CAF's serializer writes for `msg` (header as append_frame writes it).
template <class T>
std::vector<char> caf_frame(T msg, frame_kind kind) {
  std::vector<char> body;
  caf::binary_serializer sink{nullptr, body};
  REQUIRE_FALSE(sink(msg));
  std::vector<char> out(frame_header_size + body.size());
  const auto len = static_cast<std::uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(len >> (8 * i));
  out[4] = static_cast<char>(kind);
  if (!body.empty()) std::memcpy(out.data() + frame_header_size, body.data(), body.size());
  return out;
}

template <class T>
std::vector<char> our_frame(T msg, frame_kind kind) {
  std::vector<char> out{'p', 'r', 'e'};  // appends after what is there
  REQUIRE(troupe::detail::append_frame(out, kind, msg));
  REQUIRE(out.size() >= 3);
  CHECK(std::string(out.data(), 3) == "pre");
  return std::vector<char>(out.begin() + 3, out.end());
}

const std::size_t lengths[] = {0, 1, 127, 128, 300, 16383, 16384, (std::size_t{1} << 21) - 1, std::size_t{1} << 21};

}  // namespace

TEST_CASE("requests and responses are written in the very bytes CAF's serializer writes", "[actors][rpc]") {
  for (std::size_t n : lengths) {
    INFO("field bytes " << n);
    const troupe::rpc_request req{0x0102030405060708ULL, std::string(n % 200, 'f'), "worker" + std::to_string(n), bytes(n, 1),
                                  bytes(n % 301, 2)};
    CHECK(our_frame(req, frame_kind::request) == caf_frame(req, frame_kind::request));
    const troupe::rpc_response resp{~std::uint64_t{0} - n, static_cast<std::uint8_t>(n % 256), std::string(n % 150, 'm'),
                                    bytes(n, 3), bytes(n % 7, 4)};
    CHECK(our_frame(resp, frame_kind::response) == caf_frame(resp, frame_kind::response));
  }
  const troupe::rpc_request empty{};
  CHECK(our_frame(empty, frame_kind::request) == caf_frame(empty, frame_kind::request));
}

TEST_CASE("a request or response body reads back as CAF's loader reads it", "[actors][rpc]") {
  for (std::size_t n : lengths) {
    INFO("field bytes " << n);
    const troupe::rpc_request req{n * 3 + 1, "fn" + std::to_string(n), std::string(n % 130, 'c'), bytes(n, 5), bytes(n % 131, 6)};
    const auto frame = caf_frame(req, frame_kind::request);
    troupe::rpc_request got;
    REQUIRE(troupe::detail::parse_body(frame.data() + frame_header_size, frame.size() - frame_header_size, got));
    CHECK(got.id == req.id);
    CHECK(got.function == req.function);
    CHECK(got.caller == req.caller);
    CHECK(got.payload == req.payload);
    CHECK(got.meta == req.meta);
    const troupe::rpc_response resp{n, 7, std::string(n % 129, 'e'), bytes(n, 7), bytes(3, 8)};
    const auto rframe = caf_frame(resp, frame_kind::response);
    troupe::rpc_response rgot;
    REQUIRE(troupe::detail::parse_body(rframe.data() + frame_header_size, rframe.size() - frame_header_size, rgot));
    CHECK(rgot.id == resp.id);
    CHECK(rgot.code == resp.code);
    CHECK(rgot.message == resp.message);
    CHECK(rgot.payload == resp.payload);
    CHECK(rgot.meta == resp.meta);
  }
}

TEST_CASE("a request body cut anywhere, with a byte too many or with a bad length prefix is malformed", "[actors][rpc]") {
  const troupe::rpc_request req{99, "echo", "worker0", bytes(200, 1), bytes(3, 2)};
  const auto frame = caf_frame(req, frame_kind::request);
  const char* body = frame.data() + frame_header_size;
  const std::size_t n = frame.size() - frame_header_size;
  for (std::size_t cut = 0; cut < n; ++cut) {
    INFO("cut at " << cut);
    troupe::rpc_request ours, cafs;
    CHECK_FALSE(troupe::detail::parse_body(body, cut, ours));
    caf::binary_deserializer src{nullptr, body, cut};
    CHECK((src(cafs) || src.remaining() != 0));  // CAF's loader rejects it too
  }
  auto longer = std::vector<char>(body, body + n);
  longer.push_back(0);
  troupe::rpc_request extra;
  CHECK_FALSE(troupe::detail::parse_body(longer.data(), longer.size(), extra));
  // A length prefix longer than five bytes, and one announcing more than the body holds.
  std::vector<char> bad(8, 0);
  bad.insert(bad.end(), 6, static_cast<char>(0x80));
  bad.push_back(0);
  troupe::rpc_request overlong;
  CHECK_FALSE(troupe::detail::parse_body(bad.data(), bad.size(), overlong));
  std::vector<char> beyond(8, 0);
  beyond.push_back(static_cast<char>(0x85));
  beyond.push_back(0x01);  // 133 bytes of function name announced, none there
  troupe::rpc_request past;
  CHECK_FALSE(troupe::detail::parse_body(beyond.data(), beyond.size(), past));
  // And a response cut short in its code byte.
  troupe::rpc_response resp;
  const std::vector<char> eight(8, 1);
  CHECK_FALSE(troupe::detail::parse_body(eight.data(), eight.size(), resp));
}
