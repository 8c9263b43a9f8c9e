#pragma once
// Large payload buffers of the direct channel, kept for reuse (one pool per node).
//
// Note [byte pool]
//
// A tensor sent as bytes (between hosts, or with shared memory off) travels inside its
// message's payload, a std::vector<char> as large as the tensor. glibc serves some buffers with
// a fresh mmap. One is a buffer of 64 MB or more allocated on any thread but the main one.
// (A thread arena's heap is at most 64 MB.) Another is one above the main arena's mmap threshold
// (at most 32 MB). Without a pool every such message faults its buffers in page by page and
// unmaps them again (rpc_bench --no-shm counts the page faults). The node keeps the buffers of
// large payloads it is done with and hands them out again:
//
//   taken: the codec's writer growing a payload by a large block (an encode whose codec context
//          names the node's bulk_names), and the direct channel parsing a large request or
//          response frame;
//   given: the direct channel once a request or response is written, a served request once its
//          jobs are done, a call's state when it dies (its response payload).
//
// A buffer is taken only when its capacity fits the need within a factor of four. A fresh one
// is rounded up to a MiB, so the next message of about the same size fits it. The pool keeps at
// most `byte_pool_max_buffers` buffers and `byte_pool_max_bytes` bytes. When it is full, the
// smallest go first. It frees everything when the node goes.
// Buffers below `byte_pool_min_bytes` (64 KiB) are not pooled. From that size on, a frame's
// payload is read straight from the socket into its buffer (Note [direct fragment data]).
// A kept buffer keeps its size, so a message read into it needs no zero-fill first. A fresh one
// needs it, since std::vector value-initialises what it grows by. That zero-fill is a pass over
// the bytes, like the copy the direct read saves.

#include <cstddef>
#include <mutex>
#include <vector>

namespace troupe::detail {

inline constexpr std::size_t byte_pool_min_bytes = std::size_t{64} << 10;
inline constexpr std::size_t byte_pool_max_buffers = 8;
inline constexpr std::size_t byte_pool_max_bytes = std::size_t{1} << 30;
inline constexpr std::size_t byte_pool_round = std::size_t{1} << 20;

/// See the note. Thread-safe.
class byte_pool {
 public:
  byte_pool() = default;
  byte_pool(const byte_pool&) = delete;
  byte_pool& operator=(const byte_pool&) = delete;

  /// Makes `v` (its contents kept) have room for `need` bytes when it has not. It takes a pooled
  /// buffer that fits, else a fresh one rounded up to byte_pool_round. Returns whether it changed
  /// `v`'s buffer. Needs below byte_pool_min_bytes are left alone.
  bool reserve(std::vector<char>& v, std::size_t need);
  /// Makes `v` a buffer with room for `n` bytes whose contents do not matter
  /// (Note [direct fragment data]). It is a pooled one that fits when there is one. Else it is a
  /// fresh one rounded up to byte_pool_round (below byte_pool_min_bytes a plain one). Its size is
  /// at most `n`: what it had when it was given back. So growing it again to sizes it had before
  /// writes nothing: std::vector zero-fills only beyond its size. A fresh buffer has size 0, and
  /// nothing of it is touched here. `v`'s old buffer goes to the pool.
  void take(std::vector<char>& v, std::size_t n);
  /// Keeps `v`'s buffer (with its size) for reuse, or frees it; `v` is left empty.
  void give(std::vector<char>&& v);
  /// Frees every kept buffer.
  void clear();
  std::size_t kept_bytes() const;
  std::size_t kept_buffers() const;

 private:
  /// A kept buffer of capacity at least `need` (within the factor of four), else a fresh one.
  std::vector<char> fitting(std::size_t need);
  mutable std::mutex mutex_;
  std::vector<std::vector<char>> kept_;  // by capacity, ascending
  std::size_t bytes_ = 0;
};

}  // namespace troupe::detail
