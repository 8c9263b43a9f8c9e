#pragma once
// The shared arena of a shared-memory process group: one sparse segment per rank, mapped by every
// rank, from which process_group::empty_shared carves tensors (Note [shm zero copy]).

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "troupe/tensors/tensor.hpp"

namespace troupe::ddp::detail {

/// A shared-memory mapping without MAP_POPULATE (the arena is mostly untouched address space):
/// owns the mapping and the descriptor. Move-only. io_error names the segment and the call.
class sparse_mapping {
 public:
  sparse_mapping() = default;
  /// Creates (O_EXCL) and maps a named segment of `nbytes`; this object does not unlink it.
  static sparse_mapping create(const std::string& name, std::size_t nbytes);
  /// Maps an existing named segment, which must hold at least `nbytes`.
  static sparse_mapping open(const std::string& name, std::size_t nbytes);
  ~sparse_mapping();
  sparse_mapping(sparse_mapping&& o) noexcept;
  sparse_mapping& operator=(sparse_mapping&& o) noexcept;
  sparse_mapping(const sparse_mapping&) = delete;
  sparse_mapping& operator=(const sparse_mapping&) = delete;

  std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  int fd() const noexcept { return fd_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0;
  int fd_ = -1;
};

/// This rank's arena: a first-fit allocator over its own mapping. Tensors it hands out keep it
/// alive (their storage deleter returns the range), so they may outlive the process group.
class shm_arena : public std::enable_shared_from_this<shm_arena> {
 public:
  explicit shm_arena(sparse_mapping m);
  shm_arena(const shm_arena&) = delete;
  shm_arena& operator=(const shm_arena&) = delete;

  /// A zero-filled contiguous CPU tensor inside the arena; an undefined tensor when the arena
  /// has no free range that large or the memory cannot be reserved (fallocate fails).
  tensor allocate(const shape_t& shape, troupe::dtype dt);
  /// 1 + the byte offset of [p, p + n) in the arena, or 0 when it does not lie inside.
  std::uint64_t offset_of(const void* p, std::size_t n) const noexcept;
  std::byte* base() const noexcept { return map_.data(); }
  std::size_t size() const noexcept { return map_.size(); }
  /// Bytes currently handed out (for tests).
  std::size_t used() const;

 private:
  void release(std::size_t off, std::size_t len) noexcept;

  sparse_mapping map_;
  mutable std::mutex mu_;
  std::map<std::size_t, std::size_t> free_;  // offset -> length, coalesced
  std::size_t used_ = 0;
};

}  // namespace troupe::ddp::detail
