#include "troupe/tensors/allocator.hpp"

#include <cstdlib>
#include <new>
#include <string>

#include "troupe/tensors/error.hpp"
#include "troupe/tensors/storage.hpp"

namespace troupe {

namespace {
class cpu_allocator_impl final : public allocator {
 public:
  data_ptr allocate(std::size_t nbytes) override {
    if (nbytes == 0) return data_ptr(nullptr, cpu_device, nullptr, nullptr);
    const std::size_t rounded = (nbytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw error(errc::io_error, "cpu allocator: out of memory allocating " + std::to_string(nbytes) + " bytes");
    return data_ptr(p, cpu_device, [](void*, void* q) noexcept { std::free(q); }, nullptr);
  }
};
}  // namespace

allocator& cpu_allocator() noexcept {
  // Stateless: one immutable instance is enough (not mutable global state).
  static cpu_allocator_impl instance;
  return instance;
}

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
