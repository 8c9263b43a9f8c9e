// Note [fragments] and Note [direct fragment data] (rpc/fragment.hpp): putting fragments back
// together.
#include "rpc/fragment.hpp"

#include <algorithm>
#include <new>

#include "rpc/byte_pool.hpp"
#include "rpc/split_frame.hpp"

namespace troupe::detail {

namespace {
// split_head_size for the inner kind `kind` (request or response).
bool head_of(std::uint8_t kind, const char* data, std::size_t n, std::size_t& head, std::size_t& payload) {
  return kind == static_cast<std::uint8_t>(frame_kind::request) ? split_head_size<rpc_request>(data, n, head, payload)
                                                                : split_head_size<rpc_response>(data, n, head, payload);
}
}  // namespace

bool fragment_streams::reserve_room(stream& s, std::size_t room, byte_pool* pool) {
  try {
    if (pool) pool->take(s.rest, room);  // Note [byte pool], Note [direct fragment data]
    else s.rest.reserve(room);
    return true;
  } catch (const std::bad_alloc&) {
    return false;
  }
}

fragment_streams::result fragment_streams::begin_direct(stream& s, std::uint32_t id, const char* data, std::size_t here,
                                                         std::size_t left, bool last) {
  if (here > 0) std::memcpy(room_for(s, here), data, here);  // room for the rest as it comes: direct_room
  s.filled += here;
  direct_ = &s;
  direct_stream_ = id;
  direct_last_ = last;
  direct_left_ = left;
  return result::partial;
}

fragment_streams::result fragment_streams::add(const char* body, std::size_t n, std::uint8_t want, byte_pool* pool, assembled& out,
                                               std::uint64_t max_total) {
  fragment_head h;
  if (!read_fragment_head(body, n, h) || h.inner != want || h.total > max_frame_body || h.total > max_total) return result::malformed;
  const char* data = body + fragment_head_size;
  std::size_t left = n - fragment_head_size;
  auto it = open_.find(h.stream);
  if (h.flags & fragment_first) {
    if (it != open_.end() || open_.size() >= max_open_streams || announced_ + h.total > max_open_bytes) return result::malformed;
    it = open_.emplace(h.stream, stream{h.total, h.inner, {}, {}, 0}).first;
    announced_ += h.total;
    auto& s = it->second;
    // The head apart when this fragment holds all of it (else the whole body in `rest`).
    std::size_t head = 0, payload = 0;
    if (head_of(want, data, left, head, payload) && head <= h.total && head <= left) {
      s.head.assign(data, data + head);
      data += head;
      left -= head;
    }
    const std::size_t room = h.total - s.head.size();
    if (!reserve_room(s, room, pool) || left > room || ((h.flags & fragment_last) && left != room)) {
      drop(it);
      return result::malformed;
    }
  } else if (it == open_.end() || !later_fits(it, h, left)) {
    return result::malformed;
  }
  auto& s = it->second;
  if (left > 0) std::memcpy(room_for(s, left), data, left);
  s.filled += left;
  if (!(h.flags & fragment_last)) return result::partial;
  return complete(it, out);
}

bool fragment_streams::later_fits(iterator it, const fragment_head& h, std::size_t data) {
  auto& s = it->second;
  if (s.total != h.total) return false;
  const std::uint64_t after = s.head.size() + s.filled + data;
  if (after > s.total || ((h.flags & fragment_last) && after != s.total)) {
    drop(it);
    return false;
  }
  return true;
}

fragment_streams::result fragment_streams::start_direct(const char* body, std::size_t have, std::size_t n, std::uint8_t want,
                                                        std::uint64_t max_total) {
  fragment_head h;
  if (!read_fragment_head(body, have, h) || h.inner != want || h.total > max_frame_body || h.total > max_total)
    return result::malformed;
  if (h.flags & fragment_first) return result::wait_whole;
  auto it = open_.find(h.stream);
  if (it == open_.end() || have >= n || !later_fits(it, h, n - fragment_head_size)) return result::malformed;
  return begin_direct(it->second, h.stream, body + fragment_head_size, have - fragment_head_size, n - have,
                      (h.flags & fragment_last) != 0);
}

fragment_streams::result fragment_streams::start_frame(const char* body, std::size_t have, std::size_t n, std::uint8_t kind,
                                                        byte_pool* pool) {
  std::size_t head = 0, payload = 0;
  if (!head_of(kind, body, have, head, payload) || head > have || have >= n || payload > n - head) return result::wait_whole;
  whole_ = stream{n, kind, {body, body + head}, {}, 0};
  try {
    if (!reserve_room(whole_, n - head, pool)) throw std::bad_alloc();
    return begin_direct(whole_, 0, body + head, have - head, n - have, true);
  } catch (const std::bad_alloc&) {
    whole_ = stream{};
    return result::malformed;
  }
}

fragment_streams::result fragment_streams::finish_direct(assembled& out) {
  if (direct_ == &whole_) {
    direct_ = nullptr;
    hand_over(whole_, out);
    whole_ = stream{};
    return result::complete;
  }
  const auto it = open_.find(direct_stream_);
  direct_ = nullptr;
  if (!direct_last_) return result::partial;
  return complete(it, out);
}

std::size_t fragment_streams::direct_room() {
  if (direct_left_ == 0) return 0;
  auto& s = *direct_;
  if (s.rest.size() - s.filled < std::min(direct_left_, direct_step)) room_for(s, std::min(direct_left_, direct_step));
  return std::min(direct_left_, s.rest.size() - s.filled);
}

char* fragment_streams::room_for(stream& s, std::size_t n) {
  // Within the capacity reserved at the first fragment: no reallocation, since the checks keep
  // filled + n within the stream's total. It zero-fills only what the buffer never held before.
  if (s.rest.size() < s.filled + n) s.rest.resize(s.filled + n);
  return s.rest.data() + s.filled;
}

void fragment_streams::hand_over(stream& s, assembled& out) {
  out.inner = s.inner;
  out.head = std::move(s.head);
  out.rest = std::move(s.rest);
  out.rest.resize(s.filled);  // == its room (the last fragment's check): a no-op
}

fragment_streams::result fragment_streams::complete(iterator it, assembled& out) {
  hand_over(it->second, out);
  drop(it);
  return result::complete;
}

void fragment_streams::drop(iterator it) {
  if (direct_ == &it->second) {
    direct_ = nullptr;
    direct_left_ = 0;
  }
  announced_ -= it->second.total;
  open_.erase(it);
}

}  // namespace troupe::detail
