// Note [rpc payload] and Note [frame codec]: bounded decoding of what a peer sends. Every length is
// checked against the bytes left before anything is allocated; a bool is 0 or 1; leftover bytes
// are an error.
#include <sys/resource.h>

#include <cstring>
#include <string>
#include <vector>

#include <boost/serialization/vector.hpp>

#include <catch2/catch.hpp>

#include "rpc/fragment.hpp"
#include "rpc/split_frame.hpp"
#include "rpc/wire.hpp"
#include "troupe/actors/rpc/codec.hpp"

using troupe::errc;
using namespace troupe::detail;

namespace {

struct samples {
  std::vector<std::int32_t> values;
  template <class Ar> void serialize(Ar& ar, unsigned) { ar & values; }
};

// The code and message `fn` throws (ok when it does not throw).
template <class F>
troupe::error error_of(F&& fn) {
  try {
    fn();
  } catch (const troupe::error& e) {
    return e;
  }
  return troupe::error(errc::ok, "");
}

// Resident set high-water mark, in MiB.
long max_rss_mib() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

// A varbyte length of 0xFFFFFFFF (4 GiB - 1), as CAF writes it.
const std::string four_gib("\xff\xff\xff\xff\x0f", 5);

}  // namespace

TEST_CASE("a Boost user-struct argument claiming a huge vector length is refused without allocating it", "[actors][rpc][bounds]") {
  std::vector<char> bytes = troupe::rpc::encode_args<samples>(samples{{1, 2, 3}});
  // The struct's archive ends with: the u64 count 3, then three int32.
  const std::size_t count_at = bytes.size() - 3 * 4 - 8;
  REQUIRE(bytes[count_at] == 3);
  const std::uint64_t huge = std::uint64_t{1} << 40;
  std::memcpy(bytes.data() + count_at, &huge, 8);
  const long before = max_rss_mib();
  const auto e = error_of([&] { (void)troupe::rpc::decode_args<samples>(bytes, "store"); });
  CHECK(e.code() == errc::protocol_violation);
  CHECK_THAT(e.message(), Catch::Contains("collection size of 1099511627776"));
  CHECK(max_rss_mib() - before < 64);
}

TEST_CASE("a bool argument or result other than 0 or 1 is a protocol violation naming the byte", "[actors][rpc][bounds]") {
  std::vector<char> args = troupe::rpc::encode_args<bool>(true);
  args.back() = 72;
  const auto a = error_of([&] { (void)troupe::rpc::decode_args<bool>(args, "flip"); });
  CHECK(a.code() == errc::protocol_violation);
  CHECK_THAT(a.message(), Catch::Contains("byte 72"));
  std::vector<char> result = troupe::rpc::encode_result<bool>(true);
  result.back() = 72;
  const auto r = error_of([&] { (void)troupe::rpc::decode_result<bool>(result, "flip"); });
  CHECK(r.code() == errc::protocol_violation);
  CHECK_THAT(r.message(), Catch::Contains("byte 72"));
}

TEST_CASE("bytes left over after the arguments or a result are an error", "[actors][rpc][bounds]") {
  std::vector<char> args = troupe::rpc::encode_args<std::int32_t>(5);
  args.push_back(0);
  const auto a = error_of([&] { (void)troupe::rpc::decode_args<std::int32_t>(args, "inc"); });
  CHECK(a.code() == errc::bad_argument);
  CHECK_THAT(a.message(), Catch::Contains("left over"));
  std::vector<char> result = troupe::rpc::encode_result<std::int32_t>(5);
  result.push_back(0);
  const auto r = error_of([&] { (void)troupe::rpc::decode_result<std::int32_t>(result, "inc"); });
  CHECK(r.code() == errc::protocol_violation);
  CHECK_THAT(r.message(), Catch::Contains("left over"));
}

TEST_CASE("a result decoded as another type is bad_argument naming both types", "[actors][rpc][bounds]") {
  const auto as = [](const std::vector<char>& bytes, auto tag) {
    using R = typename decltype(tag)::type;
    return error_of([&] { (void)troupe::rpc::decode_result<R>(bytes, "f"); });
  };
  const auto i64 = troupe::rpc::encode_result<std::int64_t>(72);
  const auto e = as(i64, std::type_identity<double>{});
  CHECK(e.code() == errc::bad_argument);
  CHECK_THAT(e.message(), Catch::Contains("float64") && Catch::Contains("int64"));
  CHECK(as(i64, std::type_identity<std::int64_t>{}).code() == errc::ok);
  CHECK(as({}, std::type_identity<std::int32_t>{}).code() == errc::bad_argument);  // a void function's result
}

TEST_CASE("frame fields announcing 4 GiB are refused before anything is allocated", "[actors][rpc][bounds]") {
  const long before = max_rss_mib();
  SECTION("the meta of a large request") {
    // id, function "f", caller "c", a 70000-byte payload, then a meta claiming 4 GiB.
    std::string body(8, '\0');
    body += std::string("\x01" "f\x01" "c", 4);
    body += std::string("\xf0\xa2\x04", 3) + std::string(70000, 'p');  // varbyte 70000
    body += four_gib + std::string(16, 'm');
    troupe::rpc_request req;
    CHECK_FALSE(parse_split_body(body.data(), body.size(), req));
    CHECK(req.meta.capacity() < 1024);
    std::size_t head = 0, payload = 0;
    REQUIRE(split_head_size<troupe::rpc_request>(body.data(), body.size(), head, payload));
    CHECK(payload == 70000);
    const std::vector<char> h(body.begin(), body.begin() + static_cast<std::ptrdiff_t>(head));
    troupe::rpc_request parts;
    CHECK_FALSE(parse_split_parts(h, std::vector<char>(body.begin() + static_cast<std::ptrdiff_t>(head), body.end()), parts));
    CHECK(parts.meta.capacity() < 1024);
  }
  SECTION("the function name before a payload") {
    std::string body(8, '\0');
    body += four_gib + std::string(70000, 'x');
    troupe::rpc_request req;
    CHECK_FALSE(parse_split_body(body.data(), body.size(), req));
    std::size_t head = 0, payload = 0;
    CHECK_FALSE(split_head_size<troupe::rpc_request>(body.data(), body.size(), head, payload));
    CHECK(req.function.capacity() < 1024);
  }
  SECTION("the name in an auth frame") {
    const std::string body = four_gib + "xyz";
    channel_auth a;
    CHECK_FALSE(parse_body(body.data(), body.size(), a));
    CHECK(a.name.capacity() < 1024);
  }
  CHECK(max_rss_mib() - before < 64);
}

TEST_CASE("an auth frame parses as CAF wrote it, and its bool is 0 or 1", "[actors][rpc][bounds]") {
  channel_auth in{"worker1", "00ff", true};
  std::vector<char> frame;
  REQUIRE(append_frame(frame, frame_kind::auth, in));
  channel_auth out;
  REQUIRE(parse_body(frame.data() + frame_header_size, frame.size() - frame_header_size, out));
  CHECK(out.name == "worker1");
  CHECK(out.secret == "00ff");
  CHECK(out.shm_ok);
  frame.back() = 72;
  CHECK_FALSE(parse_body(frame.data() + frame_header_size, frame.size() - frame_header_size, out));
}

TEST_CASE("a fragmented total beyond the node's largest message is malformed before any room is taken", "[actors][rpc][bounds]") {
  unsigned char head[frame_header_size + fragment_head_size];
  fragment_head h{1, fragment_first, static_cast<std::uint8_t>(frame_kind::request), std::uint64_t{1} << 20};
  write_fragment_head(head, h, 0);
  std::vector<char> body(reinterpret_cast<char*>(head) + frame_header_size, reinterpret_cast<char*>(head) + sizeof head);
  body.resize(body.size() + 64, 'x');
  fragment_streams s;
  fragment_streams::assembled a;
  CHECK(s.add(body.data(), body.size(), h.inner, nullptr, a, std::uint64_t{1} << 19) == fragment_streams::result::malformed);
  CHECK(s.open() == 0);
  CHECK(s.add(body.data(), body.size(), h.inner, nullptr, a, std::uint64_t{1} << 20) == fragment_streams::result::partial);
}
