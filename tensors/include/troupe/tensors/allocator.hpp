#pragma once
/// \file allocator.hpp
/// Allocators own the memory behind tensor storage. A `data_ptr` is the move-only RAII handle
/// of one allocation: it frees through the allocator that made it.

#include <cstddef>
#include <memory>

#include "troupe/tensors/device.hpp"

namespace troupe {

/// Deleter of a data_ptr: calls back into whatever made the allocation.
using data_deleter = void (*)(void* ctx, void* ptr) noexcept;

/// Owning pointer to raw memory on a device. Move-only; frees on destruction.
class data_ptr {
 public:
  data_ptr() = default;
  data_ptr(void* ptr, device dev, data_deleter del, void* ctx) noexcept
      : ptr_(ptr), dev_(dev), del_(del), ctx_(ctx) {}
  data_ptr(data_ptr&& o) noexcept { swap(o); }
  data_ptr& operator=(data_ptr&& o) noexcept { data_ptr tmp(std::move(o)); swap(tmp); return *this; }
  data_ptr(const data_ptr&) = delete;
  data_ptr& operator=(const data_ptr&) = delete;
  ~data_ptr() { if (del_ && ptr_) del_(ctx_, ptr_); }

  void* get() const noexcept { return ptr_; }
  device dev() const noexcept { return dev_; }
  /// The allocator context (an allocator, a shared segment, ...); for owners that need it back.
  void* context() const noexcept { return ctx_; }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }

 private:
  void swap(data_ptr& o) noexcept {
    std::swap(ptr_, o.ptr_); std::swap(dev_, o.dev_); std::swap(del_, o.del_); std::swap(ctx_, o.ctx_);
  }
  void* ptr_ = nullptr;
  device dev_{};
  data_deleter del_ = nullptr;
  void* ctx_ = nullptr;
};

/// Interface of every allocator (CPU, CUDA caching, shared memory).
class allocator {
 public:
  virtual ~allocator() = default;
  /// Allocates `nbytes` (0 is allowed and returns a valid, possibly null, pointer).
  /// Throws troupe::error (io_error / cuda_failure) when memory cannot be had.
  virtual data_ptr allocate(std::size_t nbytes) = 0;
};

/// The host allocator: 64-byte aligned, so vector loads never straddle a cache line.
/// Thread-safe; returns the same object every call. Freed blocks of 1 MiB or more are cached
/// (bounded at 1 GiB) and reused for requests of the same size (Note [CPU block cache]).
allocator& cpu_allocator() noexcept;
/// Frees every cached host block (e.g. before forking many workers, or to return memory).
void release_cached_cpu_memory() noexcept;
/// Bytes currently held in the host block cache.
std::size_t cached_cpu_bytes() noexcept;

/// The default allocator of a device: cpu_allocator() for cpu, the caching allocator of the
/// device for cuda (throws device_mismatch when Troupe was built without CUDA).
allocator& default_allocator(device d);

}  // namespace troupe
