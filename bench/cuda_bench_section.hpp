#pragma once
// The CUDA part of the tensor benchmark, included by tensor_bench.cpp under TROUPE_WITH_CUDA.
// It times matmul through the tensor API against a direct cublasSgemm, and elementwise add
// against a device-to-device cudaMemcpy. Each is timed with CUDA events in the same run, with
// the result checked beside the timing. Metric names: ../shared/BENCH.md plus
//   cuda_sgemm_{1024,4096}_tflops, limit_cublas_sgemm_{1024,4096}_tflops,
//   cuda_add_gbps, limit_cuda_d2d_gbps   (GB/s count bytes read + bytes written).

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "troupe/tensors/cuda.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/reduction.hpp"

namespace troupe::bench::cuda_section {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}
inline void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string(what) + ": " + cublasGetStatusString(s));
}

/// Median milliseconds of `iters` runs of fn on the default stream, timed with CUDA events.
inline stats time_gpu(int warmup, int iters, const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  cuda::event start(0), stop(0);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    start.record(nullptr);
    fn();
    stop.record(nullptr);
    stop.synchronize();
    ms.push_back(static_cast<double>(start.elapsed_ms(stop)));
  }
  return summarize(ms);
}

/// RAII cuBLAS handle for the direct baseline.
class cublas_handle {
 public:
  cublas_handle() { check(cublasCreate(&h_), "cublasCreate"); }
  ~cublas_handle() { cublasDestroy(h_); }
  cublas_handle(const cublas_handle&) = delete;
  cublas_handle& operator=(const cublas_handle&) = delete;
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

inline void bench_sgemm(report& r, int n, bool quick) {
  generator gen(1);
  const tensor a = rand({n, n}, gen, tensor_options(dtype::float32, cuda_device(0)), -1.0, 1.0);
  const tensor b = rand({n, n}, gen, tensor_options(dtype::float32, cuda_device(0)), -1.0, 1.0);
  tensor c = empty({n, n}, tensor_options(dtype::float32, cuda_device(0)));
  const int iters = quick ? 3 : (n >= 4096 ? 20 : 100);
  const double flop = 2.0 * n * static_cast<double>(n) * n;
  tensor api_out;
  const stats api = time_gpu(2, iters, [&] { api_out = matmul(a, b); });
  cublas_handle h;
  check(cublasSetStream(h.get(), nullptr), "cublasSetStream");
  const float one = 1.0f, zero = 0.0f;
  // Row-major C = A B as column-major C^T = B^T A^T.
  const stats direct = time_gpu(2, iters, [&] {
    check(cublasSgemm(h.get(), CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, static_cast<const float*>(b.data_ptr()), n,
                      static_cast<const float*>(a.data_ptr()), n, &zero, static_cast<float*>(c.data_ptr()), n),
          "cublasSgemm");
  });
  const double err = amax(abs(sub(api_out, c))).item();  // same library, same inputs: tiny
  const std::string params = "\"n\": " + std::to_string(n) + ", \"iters\": " + std::to_string(iters) +
                             ", \"max_abs_diff\": " + std::to_string(err);
  r.add("cuda_sgemm_" + std::to_string(n) + "_tflops", flop / (api.median * 1e-3) / 1e12, "TFLOP/s", params);
  r.add("limit_cublas_sgemm_" + std::to_string(n) + "_tflops", flop / (direct.median * 1e-3) / 1e12, "TFLOP/s", params);
  if (!(err < 1e-2)) std::printf("WARNING: cuda matmul differs from cublasSgemm by %g\n", err);
}

inline void bench_add(report& r, bool quick) {
  const std::int64_t n = quick ? (std::int64_t{1} << 24) : (std::int64_t{1} << 26);
  generator gen(2);
  const tensor a = rand({n}, gen, tensor_options(dtype::float32, cuda_device(0)));
  const tensor b = rand({n}, gen, tensor_options(dtype::float32, cuda_device(0)));
  tensor d = empty({n}, tensor_options(dtype::float32, cuda_device(0)));
  const int iters = quick ? 5 : 50;
  tensor out;
  const stats add_t = time_gpu(3, iters, [&] { out = add(a, b); });
  const std::size_t bytes = static_cast<std::size_t>(n) * sizeof(float);
  const stats copy_t = time_gpu(3, iters, [&] {
    check(cudaMemcpyAsync(d.data_ptr(), a.data_ptr(), bytes, cudaMemcpyDeviceToDevice, nullptr), "cudaMemcpyAsync");
  });
  const double err = amax(abs(sub(sub(out, a), b))).item();
  const std::string params = "\"n\": " + std::to_string(n) + ", \"iters\": " + std::to_string(iters) +
                             ", \"max_abs_err\": " + std::to_string(err);
  r.add("cuda_add_gbps", 3.0 * static_cast<double>(bytes) / (add_t.median * 1e-3) / 1e9, "GB/s", params);
  r.add("limit_cuda_d2d_gbps", 2.0 * static_cast<double>(bytes) / (copy_t.median * 1e-3) / 1e9, "GB/s", params);
  if (!(err < 1e-6)) std::printf("WARNING: cuda add result is wrong (max error %g)\n", err);
}

}  // namespace troupe::bench::cuda_section

namespace troupe::bench {

/// Runs the CUDA tensor benchmarks into `r`; prints "no CUDA device" and returns when none.
inline void run_cuda_tensor_bench(report& r, bool quick) {
  if (cuda::device_count() == 0) {
    std::printf("no CUDA device: CUDA tensor benchmarks skipped\n");
    return;
  }
  cuda_section::bench_sgemm(r, 1024, quick);
  cuda_section::bench_sgemm(r, 4096, quick);
  cuda_section::bench_add(r, quick);
}

}  // namespace troupe::bench
