#pragma once
/// \file storage.hpp
/// Storage: a reference-counted block of memory that tensors view. Views of one storage share its
/// version counter, which in-place ops bump and autograd checks.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "troupe/tensors/allocator.hpp"

namespace troupe {

/// What kind of memory a storage holds; shared memory is filled in by the runtime (actors/).
enum class storage_kind : std::uint8_t { plain = 0, shared_memory = 1, external = 2 };

/// A block of bytes on one device. Always held through std::shared_ptr<storage>.
class storage {
 public:
  storage(data_ptr data, std::size_t nbytes, storage_kind kind = storage_kind::plain)
      : data_(std::move(data)), nbytes_(nbytes), kind_(kind) {}
  storage(const storage&) = delete;
  storage& operator=(const storage&) = delete;

  /// Allocates `nbytes` with `alloc`.
  static std::shared_ptr<storage> make(std::size_t nbytes, allocator& alloc);

  void* data() const noexcept { return data_.get(); }
  std::size_t nbytes() const noexcept { return nbytes_; }
  device dev() const noexcept { return data_.dev(); }
  storage_kind kind() const noexcept { return kind_; }
  const data_ptr& raw() const noexcept { return data_; }

  /// The version counter: bumped by every in-place write through any view.
  std::uint64_t version() const noexcept { return version_.load(std::memory_order_acquire); }
  void bump_version() noexcept { version_.fetch_add(1, std::memory_order_acq_rel); }

  /// Replaces the memory — used to move a storage into shared memory in place, so every view
  /// follows. The caller guarantees `data` holds at least nbytes() bytes with the same contents.
  void swap_data(data_ptr data, storage_kind kind);

  /// Opaque name of a shared segment, for shared_memory storage ("" otherwise).
  const std::string& shared_handle() const noexcept { return shared_handle_; }
  void set_shared_handle(std::string h) { shared_handle_ = std::move(h); }

 private:
  data_ptr data_;
  std::size_t nbytes_;
  storage_kind kind_;
  std::atomic<std::uint64_t> version_{0};
  std::string shared_handle_;
};

/// Hook through which the runtime moves a CPU storage into shared memory (`share_memory_()`).
/// The tensors layer knows no shared-memory mechanism; the actors layer implements this.
class shared_memory_provider {
 public:
  virtual ~shared_memory_provider() = default;
  /// Moves the bytes of `s` into a shared segment and swaps it into `s` (all views follow).
  virtual void share(storage& s) = 0;
};

}  // namespace troupe
