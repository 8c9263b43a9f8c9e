// cuBLAS, opened on the first GPU matrix product instead of linked (Note [cuBLAS on demand]).
#pragma once

#include <cublas_v2.h>

namespace troupe::cuda_detail {

// Note [cuBLAS on demand]: libcublas needs libcublasLt. Its load-time initialisation costs
// about 0.6 s of CPU in every process that links it, with or without a GPU. Linked, every
// program and test binary would pay it at start, and every exec'd rank again. Only the GPU
// matrix products use cuBLAS. So the library is opened (dlopen) on the first of them. It stays
// loaded for the rest of the process, as a linked library would. A process that never
// multiplies on a GPU never loads it.
// cublasGemmStridedBatchedEx with a cublasComputeType_t (the header also has an inline overload).
using gemm_ex_fn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                      const void*, cudaDataType, int, long long, const void*, cudaDataType, int, long long,
                                      const void*, void*, cudaDataType, int, long long, int, cublasComputeType_t,
                                      cublasGemmAlgo_t);

struct cublas_api {
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasDestroy_v2) destroy = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasSgemmStridedBatched) sgemm_strided_batched = nullptr;
  decltype(&::cublasDgemmStridedBatched) dgemm_strided_batched = nullptr;
  gemm_ex_fn gemm_strided_batched_ex = nullptr;
  decltype(&::cublasGetStatusName) status_name = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
};

/// The cuBLAS entry points, opened on the first call (thread-safe). Throws cuda_failure naming
/// the library and the loader's reason when it cannot be opened or lacks an entry point; a later
/// call tries again.
const cublas_api& cublas();

}  // namespace troupe::cuda_detail
