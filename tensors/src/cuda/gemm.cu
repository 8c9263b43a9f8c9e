// Batched matrix products through cuBLAS: [B,n,k] x [B,k,m] -> [B,n,m], out contiguous.
// float32 -> cublasSgemmStridedBatched, float64 -> cublasDgemmStridedBatched, float16/bfloat16
// -> cublasGemmStridedBatchedEx with float32 compute. One handle per (device, thread), bound to
// the current stream before each call. cuBLAS is opened on the first product (Note [cuBLAS on demand]).
//
// Row-major C = A B is column-major C^T = B^T A^T, so cuBLAS gets (m, n, k) with B first.
// An operand whose rows are unit-stride is row-major (op N in that form). One whose columns are
// unit-stride is column-major (op T). Anything else is copied to a contiguous scratch first.
#include <climits>
#include <memory>
#include <unordered_map>

#include "../kernels.hpp"
#include "common.cuh"
#include "cublas_api.hpp"

namespace troupe::kernels::cuda {

using namespace troupe::cuda_detail;

namespace {

class handle_table {
 public:
  handle_table() = default;
  handle_table(const handle_table&) = delete;
  handle_table& operator=(const handle_table&) = delete;
  ~handle_table() {
    for (auto& [dev, h] : handles_) (void)cublas().destroy(h);  // thread exit: errors ignored
  }
  cublasHandle_t get(int device) {
    auto it = handles_.find(device);
    if (it != handles_.end()) return it->second;
    cublasHandle_t h = nullptr;
    TROUPE_CUBLAS_CHECK(cublas().create(&h));
    handles_.emplace(device, h);
    return h;
  }

 private:
  std::unordered_map<int, cublasHandle_t> handles_;
};

/// The calling thread's cuBLAS handle for `device` (the device must be current), bound to the
/// device's current stream.
cublasHandle_t handle_for(int device) {
  thread_local handle_table table;
  cublasHandle_t h = table.get(device);
  TROUPE_CUBLAS_CHECK(cublas().set_stream(h, stream_of(device)));
  return h;
}

// One operand as cuBLAS sees it (column-major view of the row-major matrix).
struct operand {
  tensor t;  // the tensor actually read (the input or a contiguous copy)
  cublasOperation_t op = CUBLAS_OP_N;
  long long ld = 1;
  long long batch_stride = 0;
};

int checked_int(std::int64_t v, const char* what) {
  if (v > INT_MAX) throw error(errc::not_supported, std::string("gemm: ") + what + " " + std::to_string(v) + " exceeds cuBLAS's int range");
  return static_cast<int>(v);
}

// x is [B, R, C] row-major-logical. Column-major view: X^T (C x R).
operand describe(const tensor& x) {
  const std::int64_t R = x.size(1), C = x.size(2), sr = x.stride(1), sc = x.stride(2);
  operand o;
  o.t = x;
  if ((sc == 1 || C == 1) && (R == 1 || sr >= std::max<std::int64_t>(1, C))) {
    o.op = CUBLAS_OP_N;
    o.ld = R == 1 ? std::max<std::int64_t>(1, C) : sr;
  } else if ((sr == 1 || R == 1) && (C == 1 || sc >= std::max<std::int64_t>(1, R))) {
    o.op = CUBLAS_OP_T;
    o.ld = C == 1 ? std::max<std::int64_t>(1, R) : sc;
  } else {
    o.t = scratch(x.shape(), x.dtype(), x);
    copy(o.t, x);
    o.op = CUBLAS_OP_N;
    o.ld = std::max<std::int64_t>(1, C);
  }
  o.batch_stride = x.size(0) == 1 ? 0 : o.t.stride(0);
  checked_int(o.ld, "leading dimension");
  return o;
}

cudaDataType_t cuda_type(dtype t) { return t == dtype::float16 ? CUDA_R_16F : CUDA_R_16BF; }

void run_gemm(const tensor& out, const operand& A, const operand& B, int m, int n, int k, int batch, double alpha, double beta) {
  const int dev = device_of(out);
  cublasHandle_t h = handle_for(dev);
  const long long ldc = m, stride_c = static_cast<long long>(m) * n;
  const int lda = static_cast<int>(A.ld), ldb = static_cast<int>(B.ld);
  switch (out.dtype()) {
    case dtype::float32: {
      const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
      TROUPE_CUBLAS_CHECK(cublas().sgemm_strided_batched(h, B.op, A.op, m, n, k, &al, ptr<float>(B.t), ldb, B.batch_stride,
                                                    ptr<float>(A.t), lda, A.batch_stride, &be, ptr<float>(out),
                                                    static_cast<int>(ldc), stride_c, batch));
      return;
    }
    case dtype::float64: {
      TROUPE_CUBLAS_CHECK(cublas().dgemm_strided_batched(h, B.op, A.op, m, n, k, &alpha, ptr<double>(B.t), ldb, B.batch_stride,
                                                    ptr<double>(A.t), lda, A.batch_stride, &beta, ptr<double>(out),
                                                    static_cast<int>(ldc), stride_c, batch));
      return;
    }
    case dtype::float16:
    case dtype::bfloat16: {
      const float al = static_cast<float>(alpha), be = static_cast<float>(beta);
      const cudaDataType_t t = cuda_type(out.dtype());
      TROUPE_CUBLAS_CHECK(cublas().gemm_strided_batched_ex(h, B.op, A.op, m, n, k, &al, B.t.data_ptr(), t, ldb, B.batch_stride,
                                                     A.t.data_ptr(), t, lda, A.batch_stride, &be, out.data_ptr(), t,
                                                     static_cast<int>(ldc), stride_c, batch, CUBLAS_COMPUTE_32F,
                                                     CUBLAS_GEMM_DEFAULT));
      return;
    }
    default:
      throw error(errc::dtype_mismatch, std::string("gemm: CUDA matmul needs a floating dtype, got ") +
                                            std::string(to_string(out.dtype())));
  }
}

}  // namespace

void gemm(const tensor& out, const tensor& a, const tensor& b, double alpha, double beta) {
  const std::int64_t batch = out.size(0), n = out.size(1), m = out.size(2), k = a.size(2);
  if (batch == 0 || n == 0 || m == 0) return;
  if (k == 0) {  // empty inner dim: out = beta * out (beta 0 ignores out, NaNs included)
    if (beta == 0.0) fill(out, 0.0);
    else binary_scalar(binary_op::mul, out, out, beta);
    return;
  }
  const int dev = device_of(out);
  device_guard guard(dev);
  const operand A = describe(a), B = describe(b);
  run_gemm(out, A, B, checked_int(m, "m"), checked_int(n, "n"), checked_int(k, "k"), checked_int(batch, "batch"), alpha, beta);
}

}  // namespace troupe::kernels::cuda
