#pragma once
// Large frames of the direct channel sent in fragments, so small frames pass between them.
//
// Note [fragments]
//
// A connection is one TCP stream. A small call written after a 64 MB request would wait until
// the whole request had gone out and had been read. (Such a request is a tensor sent as bytes:
// between hosts, or with shared memory off.) So a frame whose body is at least
// `fragment_min_bytes` goes out as FRAGMENT frames (frame kind 3). Each holds at most
// `fragment_bytes` of its body. Each is written on its own (channel_conn::write_parts), so a
// frame another thread writes meanwhile goes out between two fragments:
//
//   fragment body: u32 stream, u8 flags (1 first, 2 last), u8 inner kind, u64 total body length,
//                  then the next bytes of the inner frame's body
//
// The stream number is the sender's, per connection; fragments of one stream come in order and
// streams interleave. The reader appends each fragment to its stream's body, a pooled buffer
// (Note [byte pool]). The fields before the payload are kept apart, so that the buffer becomes
// the payload without another copy. The reader handles the complete body as the inner frame:
// the transport hook, the interceptor and the codec see one whole message. While fragments go
// out, the socket's unsent bytes are kept under `unsent_low_water` (TCP_NOTSENT_LOWAT). So a
// small frame does not queue behind megabytes inside the kernel either (only then:
// channel_conn::fragmenting).
//
// The reader checks everything. It drops the connection, as for any malformed frame, on:
//   * a fragment before authentication;
//   * a fragment of an unknown inner kind (only request on an accepted connection, response on
//     an outgoing one);
//   * a first fragment for a stream it already has, or a later one for a stream it has not;
//   * a total beyond max_frame_body or node_options::max_message_bytes;
//   * more bytes than announced, or a last fragment that leaves the body short;
//   * more than `max_open_streams` streams or `max_open_bytes` announced at once.

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

#include "rpc/wire.hpp"

namespace troupe::detail {

inline constexpr std::size_t fragment_min_bytes = std::size_t{4} << 20;
inline constexpr std::size_t fragment_bytes = std::size_t{256} << 10;
inline constexpr int unsent_low_water = 256 << 10;
inline constexpr std::size_t max_open_streams = 256;
/// The totals of a connection's open streams may add up to at most this much.
inline constexpr std::uint64_t max_open_bytes = std::uint64_t{2} << 30;
/// A reader parses what it read after at most this many bytes (channel_conn::read_available).
inline constexpr std::size_t max_read_bytes = std::size_t{1} << 20;
inline constexpr std::size_t fragment_head_size = 14;

enum : std::uint8_t { fragment_first = 1, fragment_last = 2 };

/// The fields before a fragment's data.
struct fragment_head {
  std::uint32_t stream = 0;
  std::uint8_t flags = 0;
  std::uint8_t inner = 0;
  std::uint64_t total = 0;
};

/// Writes the frame header (kind fragment, body length fragment_head_size + `data`) and `h`.
inline void write_fragment_head(unsigned char (&out)[frame_header_size + fragment_head_size], const fragment_head& h,
                                std::size_t data) {
  const auto len = static_cast<std::uint32_t>(fragment_head_size + data);
  unsigned char* p = out;
  for (int i = 0; i < 4; ++i) *p++ = static_cast<unsigned char>(len >> (8 * i));
  *p++ = static_cast<unsigned char>(frame_kind::fragment);
  for (int i = 0; i < 4; ++i) *p++ = static_cast<unsigned char>(h.stream >> (8 * i));
  *p++ = h.flags;
  *p++ = h.inner;
  for (int i = 0; i < 8; ++i) *p++ = static_cast<unsigned char>(h.total >> (8 * i));
}

/// Reads the fields of a fragment body of `n` bytes; false when it is too short.
inline bool read_fragment_head(const char* body, std::size_t n, fragment_head& h) {
  if (n < fragment_head_size) return false;
  const auto* u = reinterpret_cast<const unsigned char*>(body);
  h.stream = 0;
  for (int i = 0; i < 4; ++i) h.stream |= static_cast<std::uint32_t>(u[i]) << (8 * i);
  h.flags = u[4];
  h.inner = u[5];
  h.total = 0;
  for (int i = 0; i < 8; ++i) h.total |= static_cast<std::uint64_t>(u[6 + i]) << (8 * i);
  return true;
}

class byte_pool;

/// Note [direct fragment data]
///
/// A fragment's data is read straight into its stream's buffer, not through the connection's
/// read buffer. So there is no second user-space pass over every byte of a large message sent
/// as bytes. Take a fragment of a stream already open whose head has been read and whose data
/// is not all there yet. The reader takes what is there and reads the rest of the data straight
/// into the stream's buffer. It uses recvmsg: first the rest of the fragment. Then a few KiB go
/// into the read buffer for what follows it (the next fragment's head or a small frame).
/// A stream's buffer has room for its whole body from its first fragment (a pooled buffer,
/// byte_pool::take) and a count of the bytes filled. It is grown as the data comes, at most
/// `direct_step` bytes ahead of what was received (direct_room). Growing zero-fills only what a
/// fresh buffer never held, just before the data lands there; in the steady state it zero-fills
/// nothing. So an announced total or frame length commits no memory before its data comes. A
/// peer that announces 1 GiB and sends a few bytes costs the node a reservation of address space
/// and the bytes it sent. A reader reads at most direct_room() bytes to direct_target() at a
/// time. It reads the bytes after the data (direct_tail_bytes) only together with its last ones.
/// A first fragment is read whole: it carries the message's head, which is kept apart.
/// The same checks as add() apply, when the head is read. A whole request or response frame of
/// split_payload_bytes or more is read the same way once its head is in. (Such a frame is too
/// small to be fragmented.) Its payload and the fields after it go straight into a pooled
/// buffer (start_frame).
inline constexpr std::size_t direct_tail_bytes = std::size_t{4} << 10;
/// How far ahead of the received data a direct read's buffer is grown (Note [direct fragment data]).
inline constexpr std::size_t direct_step = max_read_bytes;

/// The streams one connection's reader is putting together (whoever holds the reading role).
class fragment_streams {
 public:
  /// wait_whole (start_direct only): a first fragment, read whole and given to add().
  enum class result { partial, complete, malformed, wait_whole };
  /// A complete inner frame: its kind and its body. The body comes in two parts when the first
  /// fragment held the whole head of the request or response (split_head_size). Then `head`
  /// comes first, and `rest` holds the payload and what follows it. `rest` is one buffer that
  /// becomes the payload without a copy (parse_split_parts). Otherwise `head` is empty and
  /// `rest` is the whole body.
  struct assembled {
    std::uint8_t inner = 0;
    std::vector<char> head;
    std::vector<char> rest;
  };
  /// Adds the fragment `body` (`n` bytes); `want` is the only inner kind allowed (request or
  /// response). On complete, `out` is the frame. Buffers come from `pool` (may be null). A total
  /// beyond `max_total` (node_options::max_message_bytes) is malformed before anything is
  /// allocated. Malformed: see Note [fragments]; the connection must then be dropped.
  result add(const char* body, std::size_t n, std::uint8_t want, byte_pool* pool, assembled& out,
             std::uint64_t max_total = max_frame_body);
  std::size_t open() const { return open_.size(); }

  // Note [direct fragment data]. Takes a fragment whose body is `n` bytes; the first `have` of
  // them (at least fragment_head_size, less than `n`) are at `body`. For a later fragment of an
  // open stream, it takes those and returns partial; the rest of the data is then read to
  // direct_target(). Returns wait_whole for a first fragment, and malformed as add() would say.
  result start_direct(const char* body, std::size_t have, std::size_t n, std::uint8_t want, std::uint64_t max_total = max_frame_body);
  /// The same for a whole request or response frame (`kind`) of `n` body bytes. The first `have`
  /// of them are at `body`. When they hold the message's head (split_head_size), it keeps the
  /// head apart. It takes the rest that is here into a buffer from `pool` (may be null) and
  /// returns partial. The rest is then read to direct_target(), and finish_direct() gives the
  /// message. Returns wait_whole when the head is not all here or the body is not of that form.
  /// Such a frame is read whole and parsed as before, which judges it.
  result start_frame(const char* body, std::size_t have, std::size_t n, std::uint8_t kind, byte_pool* pool);
  /// How many bytes of the started fragment are still to be read to direct_target() (0: none).
  std::size_t direct_left() const { return direct_left_; }
  /// How many bytes may be read to direct_target() now (0 when none are left). That is the rest
  /// of the data, but at most direct_step beyond the buffer's room, which it grows to that.
  std::size_t direct_room();
  char* direct_target() { return direct_->rest.data() + direct_->filled; }
  /// `k` (at most direct_room()) bytes were read to direct_target().
  void direct_advance(std::size_t k) {
    direct_->filled += k;
    direct_left_ -= k;
  }
  /// Whether a started fragment has all its data (finish_direct is then due).
  bool direct_done() const { return direct_ != nullptr && direct_left_ == 0; }
  /// Ends the fragment once direct_done(): complete with `out` when it was its stream's last,
  /// else partial.
  result finish_direct(assembled& out);

 private:
  struct stream {
    std::uint64_t total = 0;
    std::uint8_t inner = 0;
    std::vector<char> head;
    std::vector<char> rest;   ///< room for the whole body from the first fragment on
    std::size_t filled = 0;   ///< bytes of `rest` received (its size may be larger: room_for)
  };
  using iterator = std::map<std::uint32_t, stream>::iterator;
  /// The checks of a later fragment of `data` bytes. The stream must be open, with the same
  /// total; the fragment must not pass it, and the last one must end exactly at it. Drops the
  /// stream when they fail.
  bool later_fits(iterator it, const fragment_head& h, std::size_t data);
  result complete(iterator it, assembled& out);
  /// Room for `room` bytes in `s.rest` (from `pool` when there is one); false when out of memory.
  static bool reserve_room(stream& s, std::size_t room, byte_pool* pool);
  /// Takes the `here` bytes of data at `data` into `s`. The next `left` bytes (after them) then
  /// go to direct_target(), with no room made for them yet (direct_room). `last`: the stream
  /// ends with them. Returns partial.
  result begin_direct(stream& s, std::uint32_t id, const char* data, std::size_t here, std::size_t left, bool last);
  static void hand_over(stream& s, assembled& out);
  /// Makes `s.rest` hold at least `filled + n` bytes; where the next `n` go.
  static char* room_for(stream& s, std::size_t n);
  void drop(iterator it);
  std::map<std::uint32_t, stream> open_;
  std::uint64_t announced_ = 0;  // the totals of the open streams
  // The fragment being read straight into its stream. It holds the stream (map nodes do not
  // move), its number, whether it is the stream's last fragment, and the bytes still to come.
  stream* direct_ = nullptr;
  stream whole_;  ///< a whole frame read straight into its buffer (start_frame)
  std::uint32_t direct_stream_ = 0;
  bool direct_last_ = false;
  std::size_t direct_left_ = 0;
};

}  // namespace troupe::detail
