#include "troupe/tensors/allocator.hpp"

#include <cstdlib>
#include <map>
#include <mutex>
#include <unordered_map>
#include <new>
#include <string>

#include "troupe/tensors/error.hpp"
#include "troupe/tensors/storage.hpp"

namespace troupe {

namespace {

// Note [CPU block cache]
// Large host blocks (>= 1 MiB) come from mmap inside glibc and go back to the kernel on free. A
// training loop that allocates the same 128 MiB output every step would pay its first-touch page
// faults on every call. Freed large blocks are therefore kept, keyed by their size rounded to
// 64 KiB, and handed out again to a request of the same rounded size. The cache is bounded (kCacheLimit bytes; a block that does not fit is
// freed at once) and thread-safe; release_cached_cpu_memory() empties it. Small blocks go straight
// to aligned_alloc/free.
class cpu_allocator_impl final : public allocator {
 public:
  ~cpu_allocator_impl() override { release_cached(); }

  data_ptr allocate(std::size_t nbytes) override {
    if (nbytes == 0) return data_ptr(nullptr, cpu_device, nullptr, nullptr);
    if (nbytes < kCacheMin) {
      return data_ptr(raw_alloc((nbytes + 63) / 64 * 64, nbytes), cpu_device,
                      [](void*, void* q) noexcept { std::free(q); }, nullptr);
    }
    const std::size_t rounded = (nbytes + kGranule - 1) / kGranule * kGranule;
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = free_.find(rounded); it != free_.end()) {
        p = it->second;
        free_.erase(it);
        cached_bytes_ -= rounded;
      }
    }
    if (!p) {
      try {
        p = raw_alloc(rounded, nbytes);
      } catch (const error&) {
        release_cached();  // the cache may hold what we need: give it back and retry once
        p = raw_alloc(rounded, nbytes);
      }
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_.emplace(p, rounded);
    }
    return data_ptr(p, cpu_device, &cpu_allocator_impl::release_large, this);
  }

  void release_cached() noexcept {
    std::multimap<std::size_t, void*> drop;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      drop.swap(free_);
      cached_bytes_ = 0;
    }
    for (auto& [size, q] : drop) std::free(q);
  }

  std::size_t cached_bytes() const noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    return cached_bytes_;
  }

 private:
  static constexpr std::size_t kCacheMin = std::size_t{1} << 20;
  static constexpr std::size_t kGranule = std::size_t{64} << 10;
  static constexpr std::size_t kCacheLimit = std::size_t{1} << 30;

  static void* raw_alloc(std::size_t rounded, std::size_t nbytes) {
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw error(errc::io_error, "cpu allocator: out of memory allocating " + std::to_string(nbytes) + " bytes");
    return p;
  }

  static void release_large(void* ctx, void* p) noexcept {
    auto* self = static_cast<cpu_allocator_impl*>(ctx);
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      auto it = self->live_.find(p);
      const std::size_t size = it->second;
      self->live_.erase(it);
      if (self->cached_bytes_ + size <= kCacheLimit) {
        self->free_.emplace(size, p);
        self->cached_bytes_ += size;
        return;
      }
    }
    std::free(p);
  }

  mutable std::mutex mutex_;
  std::unordered_map<void*, std::size_t> live_;  // large blocks handed out -> rounded size
  std::multimap<std::size_t, void*> free_;       // cached large blocks by rounded size
  std::size_t cached_bytes_ = 0;
};

cpu_allocator_impl& cpu_allocator_instance() noexcept {
  // The host allocator is process-wide like malloc itself; its only state is the block cache.
  static cpu_allocator_impl instance;
  return instance;
}
}  // namespace

void release_cached_cpu_memory() noexcept { cpu_allocator_instance().release_cached(); }
std::size_t cached_cpu_bytes() noexcept { return cpu_allocator_instance().cached_bytes(); }

allocator& cpu_allocator() noexcept { return cpu_allocator_instance(); }

#if !defined(TROUPE_WITH_CUDA)
allocator& default_allocator(device d) {
  if (d.is_cpu()) return cpu_allocator();
  throw error(errc::device_mismatch, "device " + to_string(d) + " requested, but Troupe was built without CUDA");
}
#endif

std::shared_ptr<storage> storage::make(std::size_t nbytes, allocator& alloc) {
  return std::make_shared<storage>(alloc.allocate(nbytes), nbytes);
}

void storage::swap_data(data_ptr data, storage_kind kind) {
  data_ = std::move(data);
  kind_ = kind;
}

}  // namespace troupe
