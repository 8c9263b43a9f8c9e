#pragma once
/// \file gradcheck.hpp
/// Finite-difference gradient checking (torch.autograd.gradcheck): compares the analytic
/// vector-Jacobian product of every input requiring grad with float64 central differences.

#include <functional>

#include "troupe/tensors/tensor.hpp"

namespace troupe {

/// Checks the gradients of `f` at `inputs`. Inputs that require grad must be float64 leaves
/// (any strides); the others are passed through unchanged. The analytic side is engine::grad
/// with a fixed non-uniform grad_output v; the numeric side is (v . (f(x+eps) - f(x-eps))) /
/// (2 eps) per element, evaluated under no_grad. Returns true, or throws
/// troupe::error(autograd_error) naming the first mismatch (input, element index, numeric vs
/// analytic); bad_argument if no input requires grad or one is not float64.
bool gradcheck(std::function<tensor(const tensor_list&)> f, tensor_list inputs, double eps = 1e-6,
               double atol = 1e-5, double rtol = 1e-3);

}  // namespace troupe
