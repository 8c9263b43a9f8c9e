// Harness: the reading side of a direct rpc connection (Note [fragments], Note [direct fragment
// data]), without a socket. Frames are cut into reads of a chosen size. They are parsed the way
// direct_channel::parse_frames and on_readable do: headers, whole frames, fragments added or
// read straight into their streams, large frames read straight into a buffer, assembled
// messages.
// Input: a flags byte, two bytes of read size, then the bytes of the stream. Flags: 1, an
// outgoing connection, so responses are read; 2, buffers from a byte pool; 4, not yet
// authenticated.
#include <algorithm>
#include <cstring>

#include "fuzz_input.hpp"
#include "rpc/byte_pool.hpp"
#include "rpc/fragment.hpp"
#include "rpc/split_frame.hpp"
#include "rpc/wire.hpp"

namespace {

using namespace troupe::detail;
using troupe::rpc_request;
using troupe::rpc_response;

// The node's node_options::max_message_bytes (direct_channel::max_body()): a frame or fragmented
// total beyond it is dropped. It is far below the default (1 GiB). A few bytes announcing a large
// frame make the reader size and zero-fill its buffer. With this limit that costs the fuzzer
// milliseconds rather than seconds under ASan. The checks are the same for every limit. A frame
// of up to 4 MiB still takes several reads of max_read_bytes.
constexpr std::uint32_t max_body = std::uint32_t{4} << 20;
static_assert(max_body >= min_message_bytes && max_body > max_read_bytes);

// One connection's reader state (channel_conn's, less the socket). `dropped`: a real reader would
// have dropped the connection here.
struct connection {
  bool outgoing = false;
  bool authed = true;
  byte_pool* pool = nullptr;
  std::vector<char> in;
  fragment_streams streams;
  bool dropped = false;

  std::uint8_t want() const { return static_cast<std::uint8_t>(outgoing ? frame_kind::response : frame_kind::request); }

  bool message(std::uint8_t kind, const char* body, std::size_t n) {
    if (kind == static_cast<std::uint8_t>(frame_kind::request)) {
      rpc_request m;
      return n >= split_payload_bytes ? parse_split_body(body, n, m) : parse_body(body, n, m);
    }
    rpc_response m;
    return n >= split_payload_bytes ? parse_split_body(body, n, m) : parse_body(body, n, m);
  }

  bool assembled(fragment_streams::assembled&& a) {
    if (a.head.empty()) {
      const bool ok = frame(a.inner, a.rest.data(), a.rest.size());
      if (pool) pool->give(std::move(a.rest));
      return ok;
    }
    if (a.inner == static_cast<std::uint8_t>(frame_kind::request)) {
      rpc_request m;
      return parse_split_parts(a.head, std::move(a.rest), m);
    }
    rpc_response m;
    return parse_split_parts(a.head, std::move(a.rest), m);
  }

  bool frame(std::uint8_t kind, const char* body, std::size_t n) {
    if (!outgoing && !authed) {
      channel_auth a;
      authed = kind == static_cast<std::uint8_t>(frame_kind::auth) && parse_body(body, n, a);  // any ticket will do
      return authed;
    }
    if (kind == static_cast<std::uint8_t>(frame_kind::fragment)) {
      fragment_streams::assembled a;
      switch (streams.add(body, n, want(), pool, a, max_body)) {
        case fragment_streams::result::partial: return true;
        case fragment_streams::result::complete: return assembled(std::move(a));
        default: return false;
      }
    }
    return kind == want() && message(kind, body, n);
  }

  // direct_channel::parse_frames.
  bool parse() {
    std::size_t at = 0;
    while (in.size() - at >= frame_header_size) {
      const std::uint32_t len = frame_length(in.data() + at);
      const bool unauthenticated = !outgoing && !authed;
      if (len > (unauthenticated ? max_auth_body : max_body) ||
          (unauthenticated && in[at + 4] != static_cast<char>(frame_kind::auth)))
        return false;
      const auto kind = static_cast<std::uint8_t>(in[at + 4]);
      const std::size_t have = in.size() - at - frame_header_size;
      if (have < len) {
        const bool fragment = kind == static_cast<std::uint8_t>(frame_kind::fragment) && have >= fragment_head_size;
        const bool large = kind == want() && len >= split_payload_bytes;
        if ((fragment || large) && streams.direct_left() == 0) {
          const char* body = in.data() + at + frame_header_size;
          const auto r = fragment ? streams.start_direct(body, have, len, want(), max_body) : streams.start_frame(body, have, len, want(), pool);
          if (r == fragment_streams::result::malformed) return false;
          if (r == fragment_streams::result::partial) {
            at = in.size();
            break;
          }
        }
        break;
      }
      if (!frame(kind, in.data() + at + frame_header_size, len)) return false;
      at += frame_header_size + len;
    }
    in.erase(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(at));
    return true;
  }

  // One read of `n` bytes (channel_conn::read_available), then direct_channel::on_readable's parsing.
  void read(const char* p, std::size_t n) {
    std::size_t direct = 0;  // what goes straight into the stream, as much as it has room for at a time
    for (std::size_t room = streams.direct_room(); direct < n && room > 0; room = streams.direct_room()) {
      const std::size_t k = std::min(n - direct, room);
      std::memcpy(streams.direct_target(), p + direct, k);
      streams.direct_advance(k);
      direct += k;
    }
    in.insert(in.end(), p + direct, p + n);
    if (streams.direct_done()) {
      fragment_streams::assembled a;
      if (streams.finish_direct(a) == fragment_streams::result::complete && !assembled(std::move(a))) {
        dropped = true;
        return;
      }
    }
    dropped = !parse();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  byte_pool pool;
  connection c;
  c.outgoing = (data[0] & 1) != 0;
  c.pool = (data[0] & 2) ? &pool : nullptr;
  c.authed = (data[0] & 4) == 0;
  const std::size_t chunk = 1 + (static_cast<std::size_t>(data[1]) | static_cast<std::size_t>(data[2]) << 8);
  const char* p = reinterpret_cast<const char*>(data + 3);
  const char* end = reinterpret_cast<const char*>(data + size);
  while (p < end && !c.dropped) {
    const std::size_t n = std::min<std::size_t>(chunk, static_cast<std::size_t>(end - p));
    c.read(p, n);
    p += n;
  }
  return 0;
}
