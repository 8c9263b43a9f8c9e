#pragma once
/// \file linalg.hpp
/// Matrix products: CBLAS sgemm/dgemm on CPU (other dtypes by a correct fallback), cuBLAS on CUDA.

#include "troupe/tensors/tensor.hpp"

namespace troupe {

/// torch.matmul semantics for 1-d, 2-d and batched (broadcast batch dims) operands.
/// Errors: shape_mismatch naming both shapes, dtype_mismatch, device_mismatch.
tensor matmul(const tensor& a, const tensor& b);
/// Batched product of [B, n, k] and [B, k, m].
tensor bmm(const tensor& a, const tensor& b);
/// out = beta * c + alpha * (a @ b) for 2-d operands (Linear's fused form).
tensor addmm(const tensor& c, const tensor& a, const tensor& b, double beta = 1.0, double alpha = 1.0);

}  // namespace troupe
