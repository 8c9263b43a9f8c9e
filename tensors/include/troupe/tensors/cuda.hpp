#pragma once
/// \file cuda.hpp
/// The CUDA runtime surface of the tensor library: device discovery, streams (one current stream
/// per device and per thread), events, and the statistics of the caching device allocator.
/// Plain C++: no CUDA header is included; streams and events are opaque handles.
/// Everything here except device_count()/is_available() exists only in builds with
/// TROUPE_WITH_CUDA; a call that reaches the CUDA runtime and fails throws
/// troupe::error(cuda_failure) naming the call, file and line.
///
/// Note [Current stream]
/// ---------------------
/// Every CUDA kernel of the tensor library enqueues on `current_stream(d)` of its device `d`.
/// The current stream is per thread and per device (a thread_local table; there is no
/// process-wide mutable stream state). Its initial value is the device's default (legacy null)
/// stream. `stream_guard` swaps in a stream for a scope and restores the previous one.
/// Memory from the caching allocator is tagged with the stream that was current when it was
/// allocated. It is reused only for allocations on that same stream (Note [Caching allocator]
/// in tensors/src/cuda/allocator.cpp). So the user synchronises a tensor used on another
/// stream with events, as in PyTorch without record_stream.

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace troupe::cuda {

#if defined(TROUPE_WITH_CUDA)
/// Number of visible CUDA devices; 0 on any error (no driver, insufficient driver, no device).
/// Never throws.
int device_count() noexcept;
/// True when at least one CUDA device is usable. Never throws.
bool is_available() noexcept;
#else
/// Number of visible CUDA devices: always 0 in a build without CUDA.
inline int device_count() noexcept { return 0; }
/// Always false in a build without CUDA.
inline bool is_available() noexcept { return false; }
#endif

/// Opaque CUDA stream handle (a cudaStream_t); nullptr is the device's default stream.
using stream_handle = void*;

/// A move-only, owning, non-blocking CUDA stream on one device (RAII: destroyed with the object).
class stream {
 public:
  /// Creates a non-blocking stream on `device`. Throws cuda_failure, device_mismatch for a bad
  /// device ordinal.
  explicit stream(int device = 0);
  ~stream();
  stream(stream&& o) noexcept;
  stream& operator=(stream&& o) noexcept;
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;

  /// The raw cudaStream_t (nullptr after a move).
  stream_handle handle() const noexcept { return handle_; }
  /// The device ordinal of the stream.
  int device() const noexcept { return device_; }
  /// Blocks until all work on the stream completed, at most `timeout` (throws timeout).
  void synchronize(std::chrono::milliseconds timeout = std::chrono::minutes(5)) const;
  /// True when all work enqueued so far completed. Non-blocking.
  bool query() const;

 private:
  stream_handle handle_ = nullptr;
  int device_ = 0;
};

/// The current stream of `device` for the calling thread (nullptr: the default stream).
stream_handle current_stream(int device);
/// Makes `s` the current stream of `device` for the calling thread (nullptr: default stream).
/// The caller keeps `s` alive while it is current.
void set_current_stream(int device, stream_handle s);

/// Makes a stream current on its device for a scope and restores the previous one on exit.
/// Not copyable or movable; lives on the stack of one thread.
class stream_guard {
 public:
  /// Makes `s` current for `s.device()`.
  explicit stream_guard(const stream& s);
  /// Makes the raw handle `s` current for `device`.
  stream_guard(int device, stream_handle s);
  ~stream_guard();
  stream_guard(const stream_guard&) = delete;
  stream_guard& operator=(const stream_guard&) = delete;

 private:
  int device_;
  stream_handle previous_;
};

/// A move-only CUDA event (RAII) for ordering work across streams and for timing.
class event {
 public:
  /// Creates an event on `device` with timing enabled. Throws cuda_failure.
  explicit event(int device = 0);
  ~event();
  event(event&& o) noexcept;
  event& operator=(event&& o) noexcept;
  event(const event&) = delete;
  event& operator=(const event&) = delete;

  /// Records the event on `s` (nullptr: the default stream of the event's device). Non-blocking.
  void record(stream_handle s);
  /// Records on the current stream of the event's device.
  void record();
  /// Makes all future work on `s` wait until this event completed. Non-blocking for the host.
  void wait(stream_handle s) const;
  /// Blocks the calling thread until the event completed, at most `timeout` (throws timeout).
  void synchronize(std::chrono::milliseconds timeout = std::chrono::minutes(5)) const;
  /// True when the work captured by the last record() completed (or it was never recorded).
  bool query() const;
  /// Milliseconds between this (earlier) event and `end`; both recorded and completed.
  /// Throws cuda_failure otherwise (cudaErrorNotReady when `end` has not completed).
  float elapsed_ms(const event& end) const;

  /// The raw cudaEvent_t.
  void* handle() const noexcept { return handle_; }
  int device() const noexcept { return device_; }

 private:
  void* handle_ = nullptr;
  int device_ = 0;
};

/// Blocks until every stream of `device` is idle (cudaDeviceSynchronize; no timeout possible:
/// prefer event::synchronize for bounded waits). Throws cuda_failure.
void synchronize(int device = 0);

/// Counters of the caching allocator of one device.
struct allocator_stats {
  std::size_t allocated_bytes = 0;     ///< bytes in live blocks (rounded block sizes)
  std::size_t cached_bytes = 0;        ///< bytes in free blocks kept for reuse
  std::uint64_t cuda_malloc_calls = 0; ///< cudaMalloc calls since the allocator was created
  std::uint64_t cuda_free_calls = 0;   ///< cudaFree calls since the allocator was created
  std::uint64_t allocations = 0;       ///< allocate() calls served (cache hits included)
};

/// Statistics of the caching allocator of `device` (creates it if needed). Throws
/// device_mismatch for a device that does not exist.
allocator_stats caching_allocator_stats(int device = 0);

/// Returns every cached free block of `device` to the driver (cudaFree; synchronises the device).
void empty_cache(int device = 0);

}  // namespace troupe::cuda
