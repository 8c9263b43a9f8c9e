#pragma once
// Frames of the direct RPC channel (Note [direct channel] in rpc/direct_channel.hpp). A frame
// is a 5-byte header (u32 body length, little endian; u8 kind) and the body. The body is a
// typed struct in CAF's binary format (its inspect()). Requests and responses are written by
// the code of Note [frame codec], with the same bytes. Byte vectors are copied raw; no float is
// ever inspected.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <caf/binary_serializer.hpp>
#include <caf/meta/type_name.hpp>

#include "bounded_deserializer.hpp"
#include "troupe/actors/messages.hpp"

namespace troupe::detail {

/// What a frame carries.
enum class frame_kind : std::uint8_t {
  request = 0,
  response = 1,
  auth = 2,
  fragment = 3,       // Note [fragments]
  actor = 4,          // a remote actor message (Note [remote actors] in remote/remote_actors.hpp)
  actor_control = 5,  // remote monitoring of actors: watch, down (the same note)
};

/// First frame on a direct connection: the one-use secret the callee issued in its hello_ack.
struct channel_auth {
  std::string name;    ///< the connecting worker
  std::string secret;  ///< hex, issued for that worker
  bool shm_ok = false; ///< the connecting worker can open the listener's memory (Note [shm reachability])
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, channel_auth& x) {
  return f(caf::meta::type_name("troupe.channel_auth"), x.name, x.secret, x.shm_ok);
}

inline constexpr std::size_t frame_header_size = 5;
/// Larger frames are a protocol violation (the connection is dropped).
inline constexpr std::uint32_t max_frame_body = std::uint32_t{1} << 30;
/// node_options::max_message_bytes below this acts as this: every frame of a small message fits.
inline constexpr std::uint32_t min_message_bytes = std::uint32_t{1} << 20;
/// Largest auth frame body (a name and a 64-digit secret fit easily).
inline constexpr std::uint32_t max_auth_body = 4096;

/// Writes the 5-byte header of a frame whose body is `len` bytes at `at`.
inline void put_frame_header(char* at, std::size_t len, frame_kind kind) {
  const unsigned char hdr[frame_header_size] = {static_cast<unsigned char>(len), static_cast<unsigned char>(len >> 8),
                                                static_cast<unsigned char>(len >> 16), static_cast<unsigned char>(len >> 24),
                                                static_cast<unsigned char>(kind)};
  std::memcpy(at, hdr, frame_header_size);
}

/// Appends one frame holding `msg` to `out`. Returns false if CAF cannot serialize it.
template <class T>
bool append_frame(std::vector<char>& out, frame_kind kind, T& msg) {
  const std::size_t at = out.size();
  out.resize(at + frame_header_size);
  caf::binary_serializer sink{nullptr, out};
  if (sink(msg)) {
    out.resize(at);
    return false;
  }
  put_frame_header(out.data() + at, out.size() - at - frame_header_size, kind);
  return true;
}

/// Reads a frame body into `msg`; false when it is malformed or leaves bytes over. Lengths are
/// bounded by the body (Note [bounded CAF reader]); requests, responses and the auth frame are
/// read by the faster overloads below.
template <class T>
bool parse_body(const char* data, std::size_t n, T& msg) {
  bounded_deserializer src{nullptr, data, n};
  return !src(msg) && src.remaining() == 0;
}

// Note [frame codec]
//
// rpc_request and rpc_response, the frames of every call, are written and read by the code
// below rather than through CAF's serializer. The bytes are the same: u64 in network order,
// u8, a string or a byte vector as CAF's varbyte length then its bytes. codec_test checks them
// against CAF's serializer and deserializer. The code below saves a virtual call and a
// caf::error per field, four times per round trip (figures in docs/benchmarks.md).
// The auth frame and the split large-payload paths (rpc/split_frame.hpp) are read by this code
// too. The reason: CAF's loader allocates a sequence's announced length before it reads a byte.
// They are written by CAF, so the two must agree, and they are tested to.
namespace frame_codec {

inline std::size_t varbyte_size(std::uint32_t x) {
  std::size_t n = 1;
  while (x > 0x7f) {
    x >>= 7;
    ++n;
  }
  return n;
}
inline char* put_varbyte(char* p, std::uint32_t x) {
  while (x > 0x7f) {
    *p++ = static_cast<char>((x & 0x7f) | 0x80);
    x >>= 7;
  }
  *p++ = static_cast<char>(x);
  return p;
}
inline char* put_u64(char* p, std::uint64_t x) {
  for (int i = 7; i >= 0; --i) *p++ = static_cast<char>(x >> (8 * i));
  return p;
}
template <class Bytes>
std::size_t seq_size(const Bytes& b) {
  return varbyte_size(static_cast<std::uint32_t>(b.size())) + b.size();
}
template <class Bytes>
char* put_seq(char* p, const Bytes& b) {
  p = put_varbyte(p, static_cast<std::uint32_t>(b.size()));
  if (!b.empty()) std::memcpy(p, b.data(), b.size());
  return p + b.size();
}

/// Reads the fields in order; any field past the end (or a length prefix longer than 5 bytes)
/// makes ok false.
struct reader {
  const char* p;
  const char* end;
  bool ok = true;
  std::uint64_t u64() {
    if (end - p < 8) return fail();
    std::uint64_t x = 0;
    for (int i = 0; i < 8; ++i) x = x << 8 | static_cast<unsigned char>(*p++);
    return x;
  }
  std::uint8_t u8() {
    if (p == end) return static_cast<std::uint8_t>(fail());
    return static_cast<unsigned char>(*p++);
  }
  /// A length prefix that must fit in the bytes left (its bytes follow it here).
  std::size_t length() {
    const std::size_t x = varbyte();
    if (static_cast<std::size_t>(end - p) < x) return fail();
    return x;
  }
  /// A length prefix whose bytes may not all be here (the caller bounds it).
  std::size_t varbyte() {
    std::uint32_t x = 0;
    for (int shift = 0; shift < 35; shift += 7) {
      if (p == end) return fail();
      const auto b = static_cast<unsigned char>(*p++);
      x |= static_cast<std::uint32_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return x;
    }
    return fail();
  }
  /// A bool: the byte 0 or 1.
  bool boolean() {
    const std::uint8_t b = u8();
    if (b > 1) fail();
    return b == 1;
  }
  template <class Bytes>
  void seq(Bytes& out) {
    const std::size_t n = length();
    if (!ok) return;
    out.assign(p, p + n);
    p += n;
  }
  std::uint64_t fail() {
    ok = false;
    p = end;
    return 0;
  }
};

}  // namespace frame_codec


/// append_frame for a request (Note [frame codec]).
inline bool append_frame(std::vector<char>& out, frame_kind kind, rpc_request& m) {
  using namespace frame_codec;
  const std::size_t body = 8 + seq_size(m.function) + seq_size(m.caller) + seq_size(m.payload) + seq_size(m.meta);
  const std::size_t at = out.size();
  out.resize(at + frame_header_size + body);
  put_frame_header(out.data() + at, body, kind);
  char* p = put_u64(out.data() + at + frame_header_size, m.id);
  p = put_seq(put_seq(put_seq(put_seq(p, m.function), m.caller), m.payload), m.meta);
  return true;
}

/// append_frame for a response (Note [frame codec]).
inline bool append_frame(std::vector<char>& out, frame_kind kind, rpc_response& m) {
  using namespace frame_codec;
  const std::size_t body = 8 + 1 + seq_size(m.message) + seq_size(m.payload) + seq_size(m.meta);
  const std::size_t at = out.size();
  out.resize(at + frame_header_size + body);
  put_frame_header(out.data() + at, body, kind);
  char* p = put_u64(out.data() + at + frame_header_size, m.id);
  *p++ = static_cast<char>(m.code);
  put_seq(put_seq(put_seq(p, m.message), m.payload), m.meta);
  return true;
}

/// parse_body for a request (Note [frame codec]).
inline bool parse_body(const char* data, std::size_t n, rpc_request& m) {
  frame_codec::reader r{data, data + n};
  m.id = r.u64();
  r.seq(m.function);
  r.seq(m.caller);
  r.seq(m.payload);
  r.seq(m.meta);
  return r.ok && r.p == r.end;
}

/// parse_body for a response (Note [frame codec]).
inline bool parse_body(const char* data, std::size_t n, rpc_response& m) {
  frame_codec::reader r{data, data + n};
  m.id = r.u64();
  m.code = r.u8();
  r.seq(m.message);
  r.seq(m.payload);
  r.seq(m.meta);
  return r.ok && r.p == r.end;
}

/// parse_body for the auth frame (Note [frame codec]). Its strings are checked against the bytes
/// left before they are allocated. CAF's loader would allocate a string's announced length first.
inline bool parse_body(const char* data, std::size_t n, channel_auth& m) {
  frame_codec::reader r{data, data + n};
  r.seq(m.name);
  r.seq(m.secret);
  m.shm_ok = r.boolean();
  return r.ok && r.p == r.end;
}

/// The body length of the frame starting at `p` (at least frame_header_size bytes).
inline std::uint32_t frame_length(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<std::uint32_t>(u[0]) | static_cast<std::uint32_t>(u[1]) << 8 | static_cast<std::uint32_t>(u[2]) << 16 |
         static_cast<std::uint32_t>(u[3]) << 24;
}

}  // namespace troupe::detail
