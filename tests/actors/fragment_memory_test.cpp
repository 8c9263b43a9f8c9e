// Note [direct fragment data]: a frame length or a fragmented total that a peer announces commits
// memory only as its data comes, whatever it says.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "rpc/fragment.hpp"
#include "rpc/split_frame.hpp"

using namespace troupe::detail;
using result = fragment_streams::result;

namespace {

constexpr auto request = static_cast<std::uint8_t>(frame_kind::request);
constexpr std::size_t announced = std::size_t{768} << 20;
constexpr long small_kib = 64 * 1024;  // far below what `announced` would take

long rss_kib() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

void put_varint(std::vector<char>& out, std::uint64_t v) {
  do {
    out.push_back(static_cast<char>((v & 0x7f) | (v >= 0x80 ? 0x80 : 0)));
    v >>= 7;
  } while (v > 0);
}

// The head of a request body whose payload is `payload` bytes: id, function, caller, payload length.
std::vector<char> request_head(std::uint64_t payload) {
  std::vector<char> body(8, 0);
  for (const std::string s : {"add", "worker0"}) {
    put_varint(body, s.size());
    body.insert(body.end(), s.begin(), s.end());
  }
  put_varint(body, payload);
  return body;
}

// Writes `n` bytes to the started direct read as a reader does: at most direct_room() at a time.
void feed(fragment_streams& s, std::size_t n) {
  const std::vector<char> data(std::size_t{64} << 10, 'd');
  while (n > 0) {
    const std::size_t room = s.direct_room();
    REQUIRE(room > 0);
    REQUIRE(room <= direct_step);
    const std::size_t k = std::min({n, room, data.size()});
    std::memcpy(s.direct_target(), data.data(), k);
    s.direct_advance(k);
    n -= k;
  }
}

}  // namespace

TEST_CASE("a large frame announcing 768 MiB commits memory only for the bytes that came", "[actors][rpc][security]") {
  std::vector<char> body = request_head(announced);
  std::size_t head = 0, payload = 0;
  REQUIRE(split_head_size<troupe::rpc_request>(body.data(), body.size(), head, payload));
  REQUIRE(head == body.size());
  body.resize(body.size() + 100, 'p');  // the first few payload bytes
  const long before = rss_kib();
  fragment_streams s;
  REQUIRE(s.start_frame(body.data(), body.size(), head + announced + 1, request, nullptr) == result::partial);
  CHECK(s.direct_left() == head + announced + 1 - body.size());
  CHECK(s.direct_room() <= direct_step);
  feed(s, std::size_t{3} << 20);  // a few MiB, then the peer stalls
  CHECK(rss_kib() - before < small_kib);
  CHECK(s.direct_left() == head + announced + 1 - body.size() - (std::size_t{3} << 20));
  CHECK_FALSE(s.direct_done());
}

TEST_CASE("a fragment stream announcing 768 MiB commits memory only for the bytes that came", "[actors][rpc][security]") {
  const std::vector<char> head = request_head(announced - 64);
  std::vector<char> first(fragment_head_size);
  unsigned char h[frame_header_size + fragment_head_size];
  write_fragment_head(h, fragment_head{7, fragment_first, request, announced}, head.size());
  std::memcpy(first.data(), h + frame_header_size, fragment_head_size);
  first.insert(first.end(), head.begin(), head.end());
  const long before = rss_kib();
  fragment_streams s;
  fragment_streams::assembled a;
  REQUIRE(s.add(first.data(), first.size(), request, nullptr, a) == result::partial);
  // A later fragment whose frame says it holds all the rest, of which only its head came.
  const std::size_t rest = announced - head.size();
  write_fragment_head(h, fragment_head{7, fragment_last, request, announced}, rest);
  std::vector<char> later(h + frame_header_size, h + sizeof h);
  REQUIRE(s.start_direct(later.data(), later.size(), fragment_head_size + rest, request) == result::partial);
  CHECK(s.direct_left() == rest);
  feed(s, std::size_t{3} << 20);
  CHECK(rss_kib() - before < small_kib);
  CHECK_FALSE(s.direct_done());
}

TEST_CASE("a large frame read in room-sized steps comes back whole", "[actors][rpc]") {
  std::vector<char> body = request_head(std::size_t{3} << 20);
  const std::size_t head = body.size();
  body.resize(head + (std::size_t{3} << 20) + 2, 0);  // the payload, then an empty meta's length
  for (std::size_t i = head; i < body.size() - 1; ++i) body[i] = static_cast<char>(i * 7);
  fragment_streams s;
  REQUIRE(s.start_frame(body.data(), head + 10, body.size(), request, nullptr) == result::partial);
  std::size_t at = head + 10;
  while (s.direct_left() > 0) {
    const std::size_t k = s.direct_room();
    REQUIRE(k > 0);
    std::memcpy(s.direct_target(), body.data() + at, k);
    s.direct_advance(k);
    at += k;
  }
  REQUIRE(s.direct_done());
  fragment_streams::assembled a;
  REQUIRE(s.finish_direct(a) == result::complete);
  std::vector<char> all = a.head;
  all.insert(all.end(), a.rest.begin(), a.rest.end());
  CHECK(all == body);
}
