// Note [fragments] (rpc/fragment.hpp): putting fragments back together.
#include "rpc/fragment.hpp"

#include <new>

#include "rpc/byte_pool.hpp"

namespace troupe::detail {

fragment_streams::result fragment_streams::add(const char* body, std::size_t n, std::uint8_t want, byte_pool* pool,
                                               std::vector<char>& whole, std::uint8_t& inner) {
  fragment_head h;
  if (!read_fragment_head(body, n, h) || h.inner != want || h.total > max_frame_body) return result::malformed;
  auto it = open_.find(h.stream);
  if (h.flags & fragment_first) {
    if (it != open_.end() || open_.size() >= max_open_streams || announced_ + h.total > max_open_bytes) return result::malformed;
    it = open_.emplace(h.stream, stream{h.total, {}}).first;
    announced_ += h.total;
    try {
      if (pool) pool->reserve(it->second.body, h.total);  // Note [byte pool]
      if (it->second.body.capacity() < h.total) it->second.body.reserve(h.total);  // one allocation, no doublings
    } catch (const std::bad_alloc&) {
      drop(it);
      return result::malformed;
    }
  } else if (it == open_.end() || it->second.total != h.total) {
    return result::malformed;
  }
  auto& s = it->second;
  const std::size_t data = n - fragment_head_size;
  if (s.body.size() + data > s.total || (h.flags & fragment_last && s.body.size() + data != s.total)) {
    drop(it);
    return result::malformed;
  }
  s.body.insert(s.body.end(), body + fragment_head_size, body + n);
  if (!(h.flags & fragment_last)) return result::partial;
  whole = std::move(s.body);
  inner = h.inner;
  drop(it);
  return result::complete;
}

void fragment_streams::drop(std::map<std::uint32_t, stream>::iterator it) {
  announced_ -= it->second.total;
  open_.erase(it);
}

}  // namespace troupe::detail
