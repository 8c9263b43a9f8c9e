#pragma once
/// \file elementwise.hpp
/// Elementwise ops with NumPy broadcasting and PyTorch type promotion. All are differentiable
/// where PyTorch's are (comparisons and where's condition are not). Errors: shape_mismatch
/// (shapes do not broadcast), device_mismatch (operands on different devices).

#include "troupe/tensors/tensor.hpp"

namespace troupe {

// Binary, tensor-tensor.
tensor add(const tensor& a, const tensor& b, double alpha = 1.0);  ///< a + alpha * b
tensor sub(const tensor& a, const tensor& b, double alpha = 1.0);  ///< a - alpha * b
tensor mul(const tensor& a, const tensor& b);
/// True division (integer inputs give float32).
tensor div(const tensor& a, const tensor& b);
tensor pow(const tensor& a, const tensor& b);
tensor maximum(const tensor& a, const tensor& b);
tensor minimum(const tensor& a, const tensor& b);

// Binary, tensor-scalar (the scalar does not change the tensor's dtype, except that an integer
// tensor with a non-integral scalar gives float32, as in PyTorch).
tensor add(const tensor& a, double b);
tensor sub(const tensor& a, double b);
tensor mul(const tensor& a, double b);
tensor div(const tensor& a, double b);
tensor pow(const tensor& a, double exponent);
tensor rsub(const tensor& a, double b);  ///< b - a
tensor rdiv(const tensor& a, double b);  ///< b / a

// Unary.
tensor neg(const tensor& a);
tensor abs(const tensor& a);
tensor exp(const tensor& a);
tensor log(const tensor& a);
tensor sqrt(const tensor& a);
tensor rsqrt(const tensor& a);
tensor relu(const tensor& a);
tensor sigmoid(const tensor& a);
tensor tanh(const tensor& a);
/// GELU, exact (erf) form, as torch.nn.functional.gelu's default.
tensor gelu(const tensor& a);
/// sign(a) in {-1, 0, 1}.
tensor sign(const tensor& a);

// Comparisons: boolean results, not differentiable.
tensor eq(const tensor& a, const tensor& b);
tensor ne(const tensor& a, const tensor& b);
tensor lt(const tensor& a, const tensor& b);
tensor le(const tensor& a, const tensor& b);
tensor gt(const tensor& a, const tensor& b);
tensor ge(const tensor& a, const tensor& b);
tensor eq(const tensor& a, double b);
tensor ne(const tensor& a, double b);
tensor lt(const tensor& a, double b);
tensor le(const tensor& a, double b);
tensor gt(const tensor& a, double b);
tensor ge(const tensor& a, double b);

/// cond ? a : b, all three broadcast; cond must be bool (dtype_mismatch otherwise).
tensor where(const tensor& cond, const tensor& a, const tensor& b);

/// True if same shape and all elements equal (NaN != NaN); different dtypes compare by value.
bool equal(const tensor& a, const tensor& b);
/// |a - b| <= atol + rtol * |b| elementwise (broadcasting), NaNs equal only if equal_nan.
bool allclose(const tensor& a, const tensor& b, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);

}  // namespace troupe
