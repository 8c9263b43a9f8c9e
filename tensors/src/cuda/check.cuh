#pragma once
// Private: checked CUDA / cuBLAS calls. Usable from .cu and from host .cpp files of the CUDA
// backend (only runtime and cuBLAS headers, no device code).

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "troupe/tensors/error.hpp"

namespace troupe::cuda_detail {

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line);

/// Sets the current CUDA device for a scope and restores the previous one (RAII).
class device_guard {
 public:
  explicit device_guard(int device);
  ~device_guard();
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int previous_ = -1;
};

/// The current stream of `device` as a cudaStream_t.
cudaStream_t stream_of(int device);

/// Throws device_mismatch naming `what` when `device` is not a visible CUDA ordinal.
void check_device(int device, const char* what);

}  // namespace troupe::cuda_detail

/// Evaluates a CUDA runtime call; throws troupe::error(cuda_failure) with the call text, file,
/// line and cudaGetErrorString when it does not return cudaSuccess.
#define TROUPE_CUDA_CHECK(call)                                                           \
  do {                                                                                    \
    const cudaError_t troupe_cuda_err_ = (call);                                          \
    if (troupe_cuda_err_ != cudaSuccess)                                                  \
      ::troupe::cuda_detail::throw_cuda_error(troupe_cuda_err_, #call, __FILE__, __LINE__); \
  } while (false)

/// Evaluates a cuBLAS call; throws troupe::error(cuda_failure) naming the call and status.
#define TROUPE_CUBLAS_CHECK(call)                                                           \
  do {                                                                                      \
    const cublasStatus_t troupe_cublas_st_ = (call);                                        \
    if (troupe_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                         \
      ::troupe::cuda_detail::throw_cublas_error(troupe_cublas_st_, #call, __FILE__, __LINE__); \
  } while (false)

/// Checks the launch of the kernel just enqueued (configuration errors surface here).
#define TROUPE_CUDA_CHECK_LAUNCH() TROUPE_CUDA_CHECK(cudaGetLastError())
