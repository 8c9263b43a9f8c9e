// Note [byte pool] (rpc/byte_pool.hpp).
#include "rpc/byte_pool.hpp"

#include <algorithm>
#include <utility>

namespace troupe::detail {

std::vector<char> byte_pool::fitting(std::size_t need) {
  std::vector<char> got;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = std::find_if(kept_.begin(), kept_.end(), [&](const auto& b) { return b.capacity() >= need; });
    if (it != kept_.end() && it->capacity() / 4 <= need) {
      got = std::move(*it);
      kept_.erase(it);
      bytes_ -= got.capacity();
    }
  }
  // None fits: a fresh one, rounded up so that a message of about the same size fits it later.
  // A frame body is a few bytes longer than the payload it carries. It is rounded to a MiB, or
  // below a MiB to byte_pool_min_bytes. So it is never twice the need: a tensor viewing its
  // payload must fill half of the buffer (Note [adopted payload]).
  if (got.capacity() < need) {
    const std::size_t round = need >= byte_pool_round ? byte_pool_round : byte_pool_min_bytes;
    got.reserve((need + round - 1) / round * round);  // `got` is empty here: nothing kept fitted
  }
  return got;
}

void byte_pool::take(std::vector<char>& v, std::size_t n) {
  if (n < byte_pool_min_bytes) {
    if (v.size() > n) v.resize(n);
    v.reserve(n);
    return;
  }
  std::vector<char> got = fitting(n);
  if (got.size() > n) got.resize(n);  // shrinking writes nothing
  v.swap(got);
  give(std::move(got));
}

bool byte_pool::reserve(std::vector<char>& v, std::size_t need) {
  if (need < byte_pool_min_bytes || v.capacity() >= need) return false;
  std::vector<char> got = fitting(need);
  got.assign(v.begin(), v.end());  // within capacity: no allocation
  v.swap(got);
  give(std::move(got));  // v's old buffer, if it was worth keeping
  return true;
}

void byte_pool::give(std::vector<char>&& v) {
  std::vector<char> mine = std::move(v);
  v.clear();
  if (mine.capacity() < byte_pool_min_bytes) return;
  std::vector<std::vector<char>> dropped;  // freed outside the lock
  std::lock_guard<std::mutex> lock(mutex_);
  const auto at = std::lower_bound(kept_.begin(), kept_.end(), mine.capacity(),
                                   [](const auto& b, std::size_t c) { return b.capacity() < c; });
  bytes_ += mine.capacity();
  kept_.insert(at, std::move(mine));
  while (kept_.size() > byte_pool_max_buffers || bytes_ > byte_pool_max_bytes) {
    bytes_ -= kept_.front().capacity();
    dropped.push_back(std::move(kept_.front()));
    kept_.erase(kept_.begin());  // the smallest: the large ones are what malloc serves worst
  }
}

void byte_pool::clear() {
  std::vector<std::vector<char>> all;
  std::lock_guard<std::mutex> lock(mutex_);
  all.swap(kept_);
  bytes_ = 0;
}

std::size_t byte_pool::kept_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

std::size_t byte_pool::kept_buffers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kept_.size();
}

}  // namespace troupe::detail
