// Error conversion for CUDA / cuBLAS calls, the device guard and device-ordinal checks.
#include "check.cuh"
#include "cublas_api.hpp"

#include <string>

#include "troupe/tensors/cuda.hpp"

namespace troupe::cuda_detail {

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  // Clear a sticky-free error so the next unrelated call does not report it again.
  (void)cudaGetLastError();
  throw error(errc::cuda_failure, std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                                      cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

void throw_cublas_error(cublasStatus_t st, const char* call, const char* file, int line) {
  throw error(errc::cuda_failure, std::string(call) + " failed at " + file + ":" + std::to_string(line) +
                                      ": " + cublas().status_name(st) + " (" + cublas().status_string(st) + ")");
}

device_guard::device_guard(int device) {
  TROUPE_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) TROUPE_CUDA_CHECK(cudaSetDevice(device));
}

device_guard::~device_guard() {
  int now = -1;
  // Restoring cannot throw from a destructor; a failure here leaves the device as it was set.
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
}

void check_device(int device, const char* what) {
  const int n = cuda::device_count();
  if (device < 0 || device >= n)
    throw error(errc::device_mismatch, std::string(what) + ": device cuda:" + std::to_string(device) +
                                           " does not exist (" + std::to_string(n) + " CUDA devices visible)");
}

cudaStream_t stream_of(int device) { return static_cast<cudaStream_t>(cuda::current_stream(device)); }

}  // namespace troupe::cuda_detail
