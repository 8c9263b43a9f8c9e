#pragma once
/// \file loss.hpp
/// Loss functions (torch.nn.functional.mse_loss / cross_entropy).

#include "troupe/tensors/tensor.hpp"

namespace troupe::nn {

/// How per-element losses are combined.
enum class reduction { none, mean, sum };

/// (input - target)^2, reduced. Shapes must be equal (shape_mismatch otherwise, naming both) and
/// dtypes equal (dtype_mismatch).
tensor mse_loss(const tensor& input, const tensor& target, reduction r = reduction::mean);

/// -log_softmax(logits)[i, target[i]], reduced; logits [N, C] floating, target [N] int64 class
/// indices. Throws shape_mismatch, dtype_mismatch, or index_out_of_range for a class outside
/// [0, C) (naming the class and C). reduction::none gives a [N] tensor.
tensor cross_entropy_loss(const tensor& logits, const tensor& target, reduction r = reduction::mean);

}  // namespace troupe::nn
