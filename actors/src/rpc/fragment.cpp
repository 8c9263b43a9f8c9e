// Note [fragments] (rpc/fragment.hpp): putting fragments back together.
#include "rpc/fragment.hpp"

#include <new>

#include "rpc/byte_pool.hpp"
#include "rpc/split_frame.hpp"

namespace troupe::detail {

fragment_streams::result fragment_streams::add(const char* body, std::size_t n, std::uint8_t want, byte_pool* pool, assembled& out) {
  fragment_head h;
  if (!read_fragment_head(body, n, h) || h.inner != want || h.total > max_frame_body) return result::malformed;
  const char* data = body + fragment_head_size;
  std::size_t left = n - fragment_head_size;
  auto it = open_.find(h.stream);
  if (h.flags & fragment_first) {
    if (it != open_.end() || open_.size() >= max_open_streams || announced_ + h.total > max_open_bytes) return result::malformed;
    it = open_.emplace(h.stream, stream{h.total, {}, {}}).first;
    announced_ += h.total;
    auto& s = it->second;
    // The head apart when this fragment holds all of it (else the whole body in `rest`).
    std::size_t head = 0, payload = 0;
    const bool split = want == static_cast<std::uint8_t>(frame_kind::request) ? split_head_size<rpc_request>(data, left, head, payload)
                                                                               : split_head_size<rpc_response>(data, left, head, payload);
    if (split && head <= h.total) {
      s.head.assign(data, data + head);
      data += head;
      left -= head;
    }
    const std::size_t room = h.total - s.head.size();
    try {
      if (pool) pool->reserve(s.rest, room);  // Note [byte pool]
      if (s.rest.capacity() < room) s.rest.reserve(room);  // one allocation, no doublings
    } catch (const std::bad_alloc&) {
      drop(it);
      return result::malformed;
    }
  } else if (it == open_.end() || it->second.total != h.total) {
    return result::malformed;
  }
  auto& s = it->second;
  const std::uint64_t after = s.head.size() + s.rest.size() + left;
  if (after > s.total || (h.flags & fragment_last && after != s.total)) {
    drop(it);
    return result::malformed;
  }
  s.rest.insert(s.rest.end(), data, data + left);
  if (!(h.flags & fragment_last)) return result::partial;
  out.inner = h.inner;
  out.head = std::move(s.head);
  out.rest = std::move(s.rest);
  drop(it);
  return result::complete;
}

void fragment_streams::drop(std::map<std::uint32_t, stream>::iterator it) {
  announced_ -= it->second.total;
  open_.erase(it);
}

}  // namespace troupe::detail
