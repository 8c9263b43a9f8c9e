// The caching device allocator and default_allocator() for CUDA builds.
//
// Note [Caching allocator]
// ------------------------
// One allocator per device, created on first use and alive until process exit.
//   allocate(n):  size = round(n)   (< 1 MiB: multiple of 512 B; else multiple of 2 MiB)
//                 stream = current_stream(device) of the calling thread
//                 free_[stream][size] non-empty ? pop (cache hit) : cudaMalloc(size)
//                   cudaMalloc out of memory -> release every cached block, retry once,
//                   then throw cuda_failure ("out of memory") naming the device and size
//   free(p):      live_[p] -> free_[its stream][its size]   (no cudaFree, no synchronisation)
// Guarantee: a block is only handed out again for the stream it was allocated on. So kernels
// that used the old tensor run before kernels that use the new one, on that same stream.
// Assumes: a tensor used on another stream is synchronised by the user (events); there is no
// record_stream. All state is guarded by one mutex per device; the deleter never throws.
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "check.cuh"
#include "troupe/tensors/allocator.hpp"
#include "troupe/tensors/cuda.hpp"

namespace troupe {

namespace {

constexpr std::size_t small_limit = std::size_t{1} << 20;
constexpr std::size_t small_round = 512;
constexpr std::size_t large_round = std::size_t{2} << 20;

std::size_t round_size(std::size_t n) {
  const std::size_t unit = n < small_limit ? small_round : large_round;
  return (n + unit - 1) / unit * unit;
}

class caching_allocator final : public allocator {
 public:
  explicit caching_allocator(int device) : device_(device) {}
  ~caching_allocator() override {
    // At process exit the runtime may already be unloading: errors are ignored here.
    for (auto& [stream, sizes] : free_)
      for (auto& [size, blocks] : sizes)
        for (void* p : blocks) (void)cudaFree(p);
  }

  data_ptr allocate(std::size_t nbytes) override {
    if (nbytes == 0) return data_ptr(nullptr, cuda_device(device_), nullptr, nullptr);
    const std::size_t size = round_size(nbytes);
    void* stream = cuda::current_stream(device_);
    std::lock_guard<std::mutex> lock(mu_);
    void* p = take_cached(stream, size);
    if (!p) p = malloc_new(size, nbytes);
    live_.emplace(p, block{size, stream});
    stats_.allocated_bytes += size;
    ++stats_.allocations;
    return data_ptr(p, cuda_device(device_), &caching_allocator::release, this);
  }

  cuda::allocator_stats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached();
  }

 private:
  struct block {
    std::size_t size;
    void* stream;
  };

  static void release(void* ctx, void* p) noexcept {
    auto* self = static_cast<caching_allocator*>(ctx);
    std::lock_guard<std::mutex> lock(self->mu_);
    const auto it = self->live_.find(p);
    if (it == self->live_.end()) return;  // not ours: cannot happen through data_ptr
    self->free_[it->second.stream][it->second.size].push_back(p);
    self->stats_.allocated_bytes -= it->second.size;
    self->stats_.cached_bytes += it->second.size;
    self->live_.erase(it);
  }

  // Requires mu_.
  void* take_cached(void* stream, std::size_t size) {
    const auto s = free_.find(stream);
    if (s == free_.end()) return nullptr;
    const auto b = s->second.find(size);
    if (b == s->second.end() || b->second.empty()) return nullptr;
    void* p = b->second.back();
    b->second.pop_back();
    stats_.cached_bytes -= size;
    return p;
  }

  // Requires mu_.
  void* malloc_new(std::size_t size, std::size_t requested) {
    cuda_detail::device_guard g(device_);
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    ++stats_.cuda_malloc_calls;
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      release_cached();
      err = cudaMalloc(&p, size);
      ++stats_.cuda_malloc_calls;
    }
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      throw error(errc::cuda_failure, "cuda:" + std::to_string(device_) + ": out of memory allocating " +
                                          std::to_string(requested) + " bytes (" + std::to_string(stats_.allocated_bytes) +
                                          " bytes in use by tensors)");
    }
    TROUPE_CUDA_CHECK(err);
    return p;
  }

  // Requires mu_. cudaFree synchronises the device, so this is only done on OOM or on request.
  void release_cached() {
    cuda_detail::device_guard g(device_);
    for (auto& [stream, sizes] : free_)
      for (auto& [size, blocks] : sizes)
        for (void* p : blocks) {
          TROUPE_CUDA_CHECK(cudaFree(p));
          ++stats_.cuda_free_calls;
          stats_.cached_bytes -= size;
        }
    free_.clear();
  }

  int device_;
  std::mutex mu_;
  std::unordered_map<void*, block> live_;
  std::unordered_map<void*, std::map<std::size_t, std::vector<void*>>> free_;
  cuda::allocator_stats stats_;
};

// The per-device allocators. Device memory is process-wide by nature, so this table is the one
// process-level object of the backend; it is created once and never re-seated.
caching_allocator& allocator_of(int device) {
  cuda_detail::check_device(device, "cuda caching allocator");
  static std::mutex mu;
  static std::vector<std::unique_ptr<caching_allocator>> table;
  std::lock_guard<std::mutex> lock(mu);
  if (table.size() <= static_cast<std::size_t>(device)) table.resize(static_cast<std::size_t>(device) + 1);
  auto& slot = table[static_cast<std::size_t>(device)];
  if (!slot) slot = std::make_unique<caching_allocator>(device);
  return *slot;
}

}  // namespace

allocator& default_allocator(device d) {
  if (d.is_cpu()) return cpu_allocator();
  return allocator_of(d.index);
}

namespace cuda {
allocator_stats caching_allocator_stats(int device) { return allocator_of(device).stats(); }
void empty_cache(int device) { allocator_of(device).empty_cache(); }
}  // namespace cuda

}  // namespace troupe
