#pragma once
/// \file reduction.hpp
/// Reductions over all dims or a set of dims, with keepdim. Empty `dims` means all dims.
/// Errors: index_out_of_range for a bad dim, bad_argument for max/min/argmax of an empty tensor.

#include "troupe/tensors/tensor.hpp"

namespace troupe {

tensor sum(const tensor& a, shape_t dims = {}, bool keepdim = false);
tensor mean(const tensor& a, shape_t dims = {}, bool keepdim = false);
/// Maximum values (differentiable: the gradient goes to the first maximal element per slice).
tensor amax(const tensor& a, shape_t dims = {}, bool keepdim = false);
tensor amin(const tensor& a, shape_t dims = {}, bool keepdim = false);
/// Index of the first maximum along dim (int64), or of the flattened tensor when dim is absent.
tensor argmax(const tensor& a, std::int64_t dim, bool keepdim = false);
tensor argmax(const tensor& a);
tensor argmin(const tensor& a, std::int64_t dim, bool keepdim = false);
/// Variance with Bessel's correction when `unbiased` (correction = 1), as torch.var.
tensor var(const tensor& a, shape_t dims = {}, bool unbiased = true, bool keepdim = false);
/// Sums `a` down to `shape` (undoes broadcasting; used by every broadcasting backward).
tensor sum_to(const tensor& a, const shape_t& shape);

}  // namespace troupe
