// kernels::cuda::copy_between_devices: host<->device through pinned staging, device<->device
// (peer) copies ordered against both devices' current streams.
//
// Note [Pinned staging]
// ---------------------
// Each (thread, device) owns two pinned chunks with one event each. A chunk is written (by the
// host or by a copy) only after its event says its previous copy completed.
//   H2D (pageable): for each chunk k: wait ev[k%2]; memcpy host->pinned; async copy pinned->device
//                   on the current stream; record ev[k%2]. Returns when the last memcpy is done:
//                   the host buffer may be reused, the device copies may still be in flight.
//   D2H (pageable): async copy of chunk k+1 is enqueued before chunk k is copied out of pinned
//                   memory (double buffering); returns when every byte reached the host buffer.
//   Pinned host memory is copied directly and waited for (the host buffer is reusable on return).
// Every wait is bounded (transfer_timeout) and fails with errc::timeout.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <unordered_map>

#include "../kernels.hpp"
#include "check.cuh"

namespace troupe::kernels::cuda {

using namespace troupe::cuda_detail;

namespace {

constexpr std::size_t chunk_bytes = std::size_t{8} << 20;
constexpr auto transfer_timeout = std::chrono::minutes(5);

void wait_event(cudaEvent_t e, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + transfer_timeout;
  for (;;) {
    const cudaError_t err = cudaEventQuery(e);
    if (err == cudaSuccess) return;
    if (err != cudaErrorNotReady) TROUPE_CUDA_CHECK(err);
    if (std::chrono::steady_clock::now() >= deadline)
      throw error(errc::timeout, std::string(what) + ": copy did not complete within 5 minutes");
    std::this_thread::yield();
  }
}

class staging {
 public:
  explicit staging(int device) : device_(device) {
    device_guard g(device);
    for (int k = 0; k < 2; ++k) {
      TROUPE_CUDA_CHECK(cudaHostAlloc(&buf_[k], chunk_bytes, cudaHostAllocPortable));
      TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&ev_[k], cudaEventDisableTiming));
    }
    TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&sync_, cudaEventDisableTiming));
  }
  ~staging() {
    // Thread exit: let pending copies finish before the pinned memory goes; errors ignored.
    for (int k = 0; k < 2; ++k) {
      if (ev_[k]) { (void)cudaEventSynchronize(ev_[k]); (void)cudaEventDestroy(ev_[k]); }
      if (buf_[k]) (void)cudaFreeHost(buf_[k]);
    }
    if (sync_) (void)cudaEventDestroy(sync_);
  }
  staging(const staging&) = delete;
  staging& operator=(const staging&) = delete;

  void* buffer(int k) { return buf_[k]; }
  cudaEvent_t chunk_event(int k) { return ev_[k]; }
  cudaEvent_t sync_event() { return sync_; }

 private:
  int device_;
  void* buf_[2] = {nullptr, nullptr};
  cudaEvent_t ev_[2] = {nullptr, nullptr};
  cudaEvent_t sync_ = nullptr;
};

staging& staging_of(int device) {
  thread_local std::unordered_map<int, std::unique_ptr<staging>> table;
  auto& slot = table[device];
  if (!slot) slot = std::make_unique<staging>(device);
  return *slot;
}

bool is_pinned(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

// Blocks until the work enqueued so far on `s` (of `device`) completed.
void wait_stream(int device, cudaStream_t s, const char* what) {
  staging& st = staging_of(device);
  TROUPE_CUDA_CHECK(cudaEventRecord(st.sync_event(), s));
  wait_event(st.sync_event(), what);
}

void host_to_device(void* dst, const void* src, std::size_t n, int device) {
  device_guard g(device);
  const cudaStream_t s = stream_of(device);
  if (is_pinned(src)) {
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s));
    wait_stream(device, s, "copy host to device");
    return;
  }
  staging& st = staging_of(device);
  for (std::size_t off = 0, k = 0; off < n; off += chunk_bytes, ++k) {
    const int b = static_cast<int>(k % 2);
    const std::size_t len = std::min(chunk_bytes, n - off);
    wait_event(st.chunk_event(b), "copy host to device");
    std::memcpy(st.buffer(b), static_cast<const char*>(src) + off, len);
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + off, st.buffer(b), len, cudaMemcpyHostToDevice, s));
    TROUPE_CUDA_CHECK(cudaEventRecord(st.chunk_event(b), s));
  }
}

void device_to_host(void* dst, const void* src, std::size_t n, int device) {
  device_guard g(device);
  const cudaStream_t s = stream_of(device);
  if (is_pinned(dst)) {
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s));
    wait_stream(device, s, "copy device to host");
    return;
  }
  staging& st = staging_of(device);
  const std::size_t chunks = (n + chunk_bytes - 1) / chunk_bytes;
  auto issue = [&](std::size_t k) {
    const int b = static_cast<int>(k % 2);
    const std::size_t off = k * chunk_bytes, len = std::min(chunk_bytes, n - off);
    wait_event(st.chunk_event(b), "copy device to host");
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(st.buffer(b), static_cast<const char*>(src) + off, len, cudaMemcpyDeviceToHost, s));
    TROUPE_CUDA_CHECK(cudaEventRecord(st.chunk_event(b), s));
  };
  issue(0);
  for (std::size_t k = 0; k < chunks; ++k) {
    if (k + 1 < chunks) issue(k + 1);
    const int b = static_cast<int>(k % 2);
    const std::size_t off = k * chunk_bytes, len = std::min(chunk_bytes, n - off);
    wait_event(st.chunk_event(b), "copy device to host");
    std::memcpy(static_cast<char*>(dst) + off, st.buffer(b), len);
  }
}

// Orders the copy after pending work on the source's current stream, and later work on the
// source stream (e.g. reuse of its memory by the caching allocator) after the copy.
void device_to_device(void* dst, int dst_dev, const void* src, int src_dev, std::size_t n) {
  const cudaStream_t s_dst = stream_of(dst_dev);
  if (src_dev == dst_dev) {
    device_guard g(dst_dev);
    TROUPE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s_dst));
    return;
  }
  const cudaStream_t s_src = stream_of(src_dev);
  cudaEvent_t src_ready = staging_of(src_dev).sync_event();
  cudaEvent_t copy_done = staging_of(dst_dev).sync_event();
  {
    device_guard g(src_dev);
    TROUPE_CUDA_CHECK(cudaEventRecord(src_ready, s_src));
  }
  device_guard g(dst_dev);
  TROUPE_CUDA_CHECK(cudaStreamWaitEvent(s_dst, src_ready, 0));
  TROUPE_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, n, s_dst));
  TROUPE_CUDA_CHECK(cudaEventRecord(copy_done, s_dst));
  TROUPE_CUDA_CHECK(cudaStreamWaitEvent(s_src, copy_done, 0));
}

}  // namespace

void copy_between_devices(const tensor& dst, const tensor& src) {
  const std::size_t n = src.nbytes();
  if (n == 0) return;
  const device dd = dst.device(), sd = src.device();
  if (sd.is_cpu() && dd.is_cuda()) host_to_device(dst.data_ptr(), src.data_ptr(), n, dd.index);
  else if (sd.is_cuda() && dd.is_cpu()) device_to_host(dst.data_ptr(), src.data_ptr(), n, sd.index);
  else if (sd.is_cuda() && dd.is_cuda()) device_to_device(dst.data_ptr(), dd.index, src.data_ptr(), sd.index, n);
  else std::memcpy(dst.data_ptr(), src.data_ptr(), n);
}

}  // namespace troupe::kernels::cuda
