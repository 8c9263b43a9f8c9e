#pragma once
// Frames of the direct RPC channel (Note [rpc fast path] in rpc/fast_path.hpp): a 5-byte header
// (u32 body length, little endian; u8 kind) and the body, a typed struct written by CAF's binary
// serializer (its inspect()); byte vectors are copied raw, no float is ever inspected.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/meta/type_name.hpp>

namespace troupe::detail {

/// What a frame carries.
enum class frame_kind : std::uint8_t { request = 0, response = 1, auth = 2, fragment = 3 /* Note [fragments] */ };

/// First frame on a direct connection: the one-use secret the callee issued in its hello_ack.
struct fast_auth {
  std::string name;    ///< the connecting worker
  std::string secret;  ///< hex, issued for that worker
  bool shm_ok = false; ///< the connecting worker can open the listener's memory (Note [shm reachability])
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fast_auth& x) {
  return f(caf::meta::type_name("troupe.fast_auth"), x.name, x.secret, x.shm_ok);
}

inline constexpr std::size_t frame_header_size = 5;
/// Larger frames are a protocol violation (the connection is dropped).
inline constexpr std::uint32_t max_frame_body = std::uint32_t{1} << 30;
/// Largest auth frame body (a name and a 64-digit secret fit easily).
inline constexpr std::uint32_t max_auth_body = 4096;

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
  const auto len = static_cast<std::uint32_t>(out.size() - at - frame_header_size);
  const unsigned char hdr[frame_header_size] = {static_cast<unsigned char>(len), static_cast<unsigned char>(len >> 8),
                                                static_cast<unsigned char>(len >> 16), static_cast<unsigned char>(len >> 24),
                                                static_cast<unsigned char>(kind)};
  std::memcpy(out.data() + at, hdr, frame_header_size);
  return true;
}

/// Reads a frame body into `msg`; false when it is malformed.
template <class T>
bool parse_body(const char* data, std::size_t n, T& msg) {
  caf::binary_deserializer src{nullptr, data, n};
  return !src(msg) && src.remaining() == 0;
}

/// The body length of the frame starting at `p` (at least frame_header_size bytes).
inline std::uint32_t frame_length(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<std::uint32_t>(u[0]) | static_cast<std::uint32_t>(u[1]) << 8 | static_cast<std::uint32_t>(u[2]) << 16 |
         static_cast<std::uint32_t>(u[3]) << 24;
}

}  // namespace troupe::detail
