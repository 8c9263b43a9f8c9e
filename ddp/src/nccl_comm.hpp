#pragma once
// Private: the communicator shared by an nccl_process_group and its works, checked NCCL calls,
// and the work state (Note [NCCL process group] in nccl_process_group.hpp). Included only in
// builds with TROUPE_WITH_NCCL.

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/flight_recorder.hpp"
#include "troupe/ddp/nccl_process_group.hpp"
#include "troupe/tensors/cuda.hpp"

namespace troupe::ddp::nccl_detail {

using clock = std::chrono::steady_clock;

/// nccl_failure naming `context`, the call, file and line, ncclGetErrorString and ncclGetLastError.
troupe::error nccl_error(ncclResult_t r, const std::string& context, const char* call, const char* file, int line);
[[noreturn]] void throw_nccl_error(ncclResult_t r, const char* call, const char* file, int line);
[[noreturn]] void throw_cuda_error(cudaError_t e, const char* call, const char* file, int line);

/// Makes `device` current for a scope and restores the previous device (RAII). NCCL binds a
/// communicator to the device current at its creation.
class device_guard {
 public:
  explicit device_guard(int device);
  ~device_guard();
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int previous_ = -1;
};

/// Backoff for polling loops: yields a few times, then sleeps 10 us doubling up to 1 ms.
class backoff {
 public:
  void pause();

 private:
  int rounds_ = 0;
};

/// The NCCL communicator of one group. Every NCCL call on it is made under `mu`. NCCL does not
/// allow concurrent calls on one communicator. A non-blocking one must be polled out of
/// ncclInProgress before the next call. Lock order: work state mutex, then `mu`.
struct communicator {
  std::mutex mu;
  ncclComm_t comm = nullptr;
  int device = 0;
  std::string label;                   // "nccl_process_group 'g' rank 0 on cuda:0"
  std::optional<troupe::error> dead;  // why it was aborted or destroyed

  communicator() = default;
  /// Aborts a communicator nobody destroyed (a constructor that threw half-way). Never throws.
  ~communicator();
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;

  /// ncclCommAbort (once) and remember `why` as the cause of death. Never throws.
  void abort_locked(const troupe::error& why) noexcept;
  /// Throws invalid_state naming `what` and the cause when the communicator is dead.
  void ensure_alive_locked(const std::string& what) const;
  /// The communicator's state: ncclSuccess, ncclInProgress or the asynchronous error.
  ncclResult_t async_error_locked() noexcept;
  /// Polls a call that answered ncclInProgress until it settles; on an error or at `deadline`
  /// aborts the communicator and throws nccl_failure / timeout.
  void settle_locked(ncclResult_t r, const char* call, const char* file, int line, clock::time_point deadline);
};

/// A `work` that delegates to `w` (wait, poll, error, synchronize_stream).
work as_work(nccl_work w);

}  // namespace troupe::ddp::nccl_detail

/// Evaluates an NCCL call that does not involve a non-blocking communicator; throws
/// troupe::error(nccl_failure) with the call text, file, line and NCCL's messages otherwise.
#define TROUPE_NCCL_CHECK(call)                                                             \
  do {                                                                                      \
    const ncclResult_t troupe_nccl_res_ = (call);                                           \
    if (troupe_nccl_res_ != ncclSuccess)                                                    \
      ::troupe::ddp::nccl_detail::throw_nccl_error(troupe_nccl_res_, #call, __FILE__, __LINE__); \
  } while (false)

/// Evaluates an NCCL call on the communicator `c` (its mutex held) and settles it: polls
/// ncclInProgress until `deadline`, aborts `c` and throws on an error.
#define TROUPE_NCCL_SETTLE(c, call, deadline) (c).settle_locked((call), #call, __FILE__, __LINE__, (deadline))

/// Evaluates a CUDA runtime call; throws troupe::error(cuda_failure) naming it.
#define TROUPE_DDP_CUDA_CHECK(call)                                                          \
  do {                                                                                       \
    const cudaError_t troupe_cuda_res_ = (call);                                             \
    if (troupe_cuda_res_ != cudaSuccess)                                                     \
      ::troupe::ddp::nccl_detail::throw_cuda_error(troupe_cuda_res_, #call, __FILE__, __LINE__); \
  } while (false)

namespace troupe::ddp {

/// One collective in flight: its completion event and the tensors it keeps alive.
struct nccl_work::state {
  using clock_point = nccl_detail::clock::time_point;
  std::shared_ptr<nccl_detail::communicator> comm;
  std::string description;
  cuda::event done;  // recorded on the NCCL stream after the launch
  std::mutex mu;
  bool completed = false;
  std::optional<troupe::error> err;
  std::vector<tensor> keep;  // released once the completion was observed
  clock_point launched_at = nccl_detail::clock::now();  // the watchdog's reference
  std::shared_ptr<flight_recorder> recorder;  // Note [NCCL flight recorder]; may be null
  std::uint64_t token = 0;                    // its entry, ended when the completion is observed
  bool blamed = false;                        // the watchdog reported it once (under the watchdog)

  state(std::shared_ptr<nccl_detail::communicator> c, std::string d);
  /// True once finished (successfully or not); checks the communicator's death and
  /// asynchronous error before the event (an aborted kernel also completes its event). An
  /// asynchronous error aborts the communicator. Never blocks for long.
  bool poll();
  /// Marks the work finished with `e` (nullopt: success) and releases the tensors.
  void finish_locked(std::optional<troupe::error> e);
  /// Fails the work with `e` and aborts the communicator, unless it finished already (the
  /// watchdog and a timed-out wait). Never throws.
  void expire(const troupe::error& e);
};

}  // namespace troupe::ddp
