// Streams, the per-thread current stream table, events (Note [Current stream] in cuda.hpp).
#include <thread>
#include <unordered_map>
#include <utility>

#include "check.cuh"
#include "troupe/tensors/cuda.hpp"

namespace troupe::cuda {

using cuda_detail::device_guard;

int device_count() noexcept {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // no driver / insufficient driver: report "no device"
    return 0;
  }
  return n;
}

bool is_available() noexcept { return device_count() > 0; }

namespace {

// The calling thread's current stream per device (absent: the default stream).
std::unordered_map<int, stream_handle>& current_streams() {
  thread_local std::unordered_map<int, stream_handle> table;
  return table;
}

// Polls `done` until it returns true or `timeout` passes; throws timeout naming `what`.
template <class Done>
void wait_until(Done&& done, std::chrono::milliseconds timeout, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline)
      throw error(errc::timeout, std::string(what) + ": GPU work did not complete within " +
                                     std::to_string(timeout.count()) + " ms");
    std::this_thread::yield();
  }
}

}  // namespace

// ---- stream -------------------------------------------------------------------------------

stream::stream(int device) : device_(device) {
  cuda_detail::check_device(device, "cuda::stream");
  device_guard g(device);
  cudaStream_t s = nullptr;
  TROUPE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  handle_ = s;
}

stream::~stream() {
  if (handle_) (void)cudaStreamDestroy(static_cast<cudaStream_t>(handle_));  // no throw in a destructor
}

stream::stream(stream&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)), device_(o.device_) {}

stream& stream::operator=(stream&& o) noexcept {
  if (this != &o) {
    if (handle_) (void)cudaStreamDestroy(static_cast<cudaStream_t>(handle_));
    handle_ = std::exchange(o.handle_, nullptr);
    device_ = o.device_;
  }
  return *this;
}

bool stream::query() const {
  const cudaError_t err = cudaStreamQuery(static_cast<cudaStream_t>(handle_));
  if (err == cudaErrorNotReady) return false;
  TROUPE_CUDA_CHECK(err);
  return true;
}

void stream::synchronize(std::chrono::milliseconds timeout) const {
  wait_until([&] { return query(); }, timeout, "cuda::stream::synchronize");
}

stream_handle current_stream(int device) {
  const auto& t = current_streams();
  const auto it = t.find(device);
  return it == t.end() ? nullptr : it->second;
}

void set_current_stream(int device, stream_handle s) {
  if (s == nullptr) current_streams().erase(device);
  else current_streams()[device] = s;
}

stream_guard::stream_guard(const stream& s) : stream_guard(s.device(), s.handle()) {}

stream_guard::stream_guard(int device, stream_handle s) : device_(device), previous_(current_stream(device)) {
  set_current_stream(device, s);
}

stream_guard::~stream_guard() { set_current_stream(device_, previous_); }

// ---- event --------------------------------------------------------------------------------

event::event(int device) : device_(device) {
  cuda_detail::check_device(device, "cuda::event");
  device_guard g(device);
  cudaEvent_t e = nullptr;
  TROUPE_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
  handle_ = e;
}

event::~event() {
  if (handle_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
}

event::event(event&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)), device_(o.device_) {}

event& event::operator=(event&& o) noexcept {
  if (this != &o) {
    if (handle_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(handle_));
    handle_ = std::exchange(o.handle_, nullptr);
    device_ = o.device_;
  }
  return *this;
}

void event::record(stream_handle s) {
  if (!handle_) throw error(errc::invalid_state, "cuda::event::record on a moved-from event");
  device_guard g(device_);
  TROUPE_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(handle_), static_cast<cudaStream_t>(s)));
}

void event::record() { record(current_stream(device_)); }

void event::wait(stream_handle s) const {
  if (!handle_) throw error(errc::invalid_state, "cuda::event::wait on a moved-from event");
  TROUPE_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(s), static_cast<cudaEvent_t>(handle_), 0));
}

bool event::query() const {
  if (!handle_) throw error(errc::invalid_state, "cuda::event::query on a moved-from event");
  const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(handle_));
  if (err == cudaErrorNotReady) return false;
  TROUPE_CUDA_CHECK(err);
  return true;
}

void event::synchronize(std::chrono::milliseconds timeout) const {
  wait_until([&] { return query(); }, timeout, "cuda::event::synchronize");
}

float event::elapsed_ms(const event& end) const {
  if (!handle_ || !end.handle_) throw error(errc::invalid_state, "cuda::event::elapsed_ms on a moved-from event");
  float ms = 0.0f;
  TROUPE_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(handle_), static_cast<cudaEvent_t>(end.handle_)));
  return ms;
}

void synchronize(int device) {
  cuda_detail::check_device(device, "cuda::synchronize");
  device_guard g(device);
  TROUPE_CUDA_CHECK(cudaDeviceSynchronize());
}

}  // namespace troupe::cuda
