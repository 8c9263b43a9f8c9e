#pragma once
// A request or response frame of the direct channel whose payload is not copied into it.
// It is written with one sendmsg in three parts. First come the bytes before the payload: the
// frame header, the fields before it, its length. Then the payload itself, borrowed from the
// message, and the bytes after it. On the wire it is exactly append_frame's frame of the same
// message (tested in codec_test). A large tensor sent as bytes (between hosts) is then copied
// once less on the sending side. No second buffer of its size is allocated for the frame.

#include <cstddef>
#include <cstdint>
#include <vector>

#include <caf/binary_serializer.hpp>

#include "rpc/borrowed_parts.hpp"
#include "rpc/wire.hpp"
#include "troupe/actors/messages.hpp"

namespace troupe::detail {

/// Payloads at least this large are sent split (below it one copy is cheaper than the iovecs).
inline constexpr std::size_t split_payload_bytes = std::size_t{64} << 10;

struct split_frame {
  std::vector<char> head;
  const std::vector<char>* payload = nullptr;  ///< the message's; must outlive the send
  /// Tensor bytes that belong in the payload (Note [borrowed tensor bytes]); null: none. Must
  /// outlive the send.
  const rpc::detail::borrowed_parts* borrowed = nullptr;
  std::vector<char> tail;
  std::size_t payload_size() const { return (payload ? payload->size() : 0) + (borrowed ? borrowed->bytes() : 0); }
  std::size_t size() const { return head.size() + payload_size() + tail.size(); }
  /// Calls `piece(data, size)` for the payload's pieces in order.
  template <class F>
  void for_each_payload_piece(F&& piece) const {
    if (!payload) return;
    if (borrowed) borrowed->for_each_piece(*payload, piece);
    else if (!payload->empty()) piece(payload->data(), payload->size());
  }
  /// The whole frame as one buffer (for the paths that keep a frame: batches, delays).
  std::vector<char> flat() const {
    std::vector<char> out;
    out.reserve(size());
    out.insert(out.end(), head.begin(), head.end());
    for_each_payload_piece([&](const char* p, std::size_t n) { out.insert(out.end(), p, p + n); });
    out.insert(out.end(), tail.begin(), tail.end());
    return out;
  }
};

namespace split_detail {
// The fields that inspect() writes before the payload (messages.hpp), in its order.
inline bool before_payload(caf::binary_serializer& s, rpc_request& m) { return !s(m.id, m.function, m.caller); }
inline bool before_payload(caf::binary_serializer& s, rpc_response& m) { return !s(m.id, m.code, m.message); }
// Read by Note [frame codec]'s reader: every length is checked against the bytes left.
inline bool before_payload(frame_codec::reader& r, rpc_request& m) {
  m.id = r.u64();
  r.seq(m.function);
  r.seq(m.caller);
  return r.ok;
}
inline bool before_payload(frame_codec::reader& r, rpc_response& m) {
  m.id = r.u64();
  m.code = r.u8();
  r.seq(m.message);
  return r.ok;
}
}  // namespace split_detail

/// parse_body for a body with a large payload. The payload is copied once into `msg.payload`,
/// whose capacity is kept (a pooled buffer, Note [byte pool]). There is no zero-fill first, as
/// CAF's loader would do: a whole extra pass over a large tensor sent as bytes. Same result and
/// the same checks as parse_body (tested in split_frame_test).
template <class T>
bool parse_split_body(const char* data, std::size_t n, T& msg) {
  frame_codec::reader src{data, data + n};
  if (!split_detail::before_payload(src, msg)) return false;
  const std::size_t len = src.length();
  if (!src.ok) return false;
  msg.payload.assign(src.p, src.p + len);
  src.p += len;
  src.seq(msg.meta);
  return src.ok && src.p == src.end;
}

/// The head of a body: the fields before the payload and its length prefix. When `data` (the
/// body's first `n` bytes) holds all of it, returns its size and the payload's length. For
/// fragments put together around the payload (Note [fragments]).
template <class T>
bool split_head_size(const char* data, std::size_t n, std::size_t& head, std::size_t& payload) {
  T msg;
  frame_codec::reader src{data, data + n};
  if (!split_detail::before_payload(src, msg)) return false;
  payload = src.varbyte();  // its bytes are not all here: the callers bound it by the body's size
  if (!src.ok) return false;
  head = static_cast<std::size_t>(src.p - data);
  return true;
}

/// A message from a body kept in two parts: `head` (split_head_size bytes) and `rest` (the
/// payload, then the fields after it). `rest` becomes the payload without a copy (its buffer
/// kept); false when malformed.
template <class T>
bool parse_split_parts(const std::vector<char>& head, std::vector<char>&& rest, T& msg) {
  frame_codec::reader h{head.data(), head.data() + head.size()};
  if (!split_detail::before_payload(h, msg)) return false;
  const std::size_t len = h.varbyte();
  if (!h.ok || h.p != h.end || len > rest.size()) return false;
  frame_codec::reader tail{rest.data() + len, rest.data() + rest.size()};
  tail.seq(msg.meta);
  if (!tail.ok || tail.p != tail.end) return false;
  rest.resize(len);
  msg.payload = std::move(rest);
  return true;
}

/// Builds `f` for `msg` (rpc_request or rpc_response); `f.payload` points into `msg`, and
/// `f.borrowed` to `borrowed` (may be null), whose bytes belong in the payload. False when the
/// message cannot be serialized or its body is larger than `max_body` (at most max_frame_body).
template <class T>
bool make_split_frame(split_frame& f, frame_kind kind, T& msg, std::size_t max_body = max_frame_body,
                      const rpc::detail::borrowed_parts* borrowed = nullptr) {
  std::vector<char> payload;
  payload.swap(msg.payload);  // serialized without it, its place is one byte: length 0
  std::vector<char> rest;
  const bool framed = append_frame(rest, kind, msg);
  payload.swap(msg.payload);
  if (!framed) return false;
  std::vector<char> prefix;
  caf::binary_serializer ps{nullptr, prefix};
  if (!split_detail::before_payload(ps, msg)) return false;
  const std::size_t after = frame_header_size + prefix.size() + 1;  // header, fields, the 0 length
  if (rest.size() < after || rest[after - 1] != 0) return false;  // inspect() changed: fall back
  f.head.assign(rest.begin(), rest.begin() + static_cast<std::ptrdiff_t>(frame_header_size + prefix.size()));
  caf::binary_serializer hs{nullptr, f.head};
  f.payload = &msg.payload;
  f.borrowed = borrowed && !borrowed->empty() ? borrowed : nullptr;
  std::size_t n = f.payload_size();
  if (n > max_frame_body || hs.begin_sequence(n)) return false;
  f.tail.assign(rest.begin() + static_cast<std::ptrdiff_t>(after), rest.end());
  const std::size_t body = f.size() - frame_header_size;
  if (body > max_frame_body || body > max_body) return false;
  const unsigned char len[4] = {static_cast<unsigned char>(body), static_cast<unsigned char>(body >> 8),
                                static_cast<unsigned char>(body >> 16), static_cast<unsigned char>(body >> 24)};
  std::memcpy(f.head.data(), len, sizeof len);
  return true;
}

}  // namespace troupe::detail
