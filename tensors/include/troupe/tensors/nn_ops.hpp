#pragma once
/// \file nn_ops.hpp
/// Ops the neural-network layers are built from: softmax family, indexing and joining.

#include "troupe/tensors/tensor.hpp"

namespace troupe {

/// Numerically stable softmax along dim.
tensor softmax(const tensor& a, std::int64_t dim);
tensor log_softmax(const tensor& a, std::int64_t dim);

/// Rows (or slices) of `a` at `index` (1-d int64/int32) along dim. index_out_of_range on a bad index.
tensor index_select(const tensor& a, std::int64_t dim, const tensor& index);
/// out[i][j] = a[i][index[i][j]] for dim 1 (torch.gather).
tensor gather(const tensor& a, std::int64_t dim, const tensor& index);
/// Returns a copy of `a` with src added at index along dim (torch.scatter_add, out of place).
tensor scatter_add(const tensor& a, std::int64_t dim, const tensor& index, const tensor& src);
/// Returns a copy of `a` with the slices of `src` added at `index` along dim (torch.index_add).
tensor index_add(const tensor& a, std::int64_t dim, const tensor& index, const tensor& src);
/// Concatenation along dim.
tensor cat(const tensor_list& tensors, std::int64_t dim = 0);
/// Stacks along a new dim.
tensor stack(const tensor_list& tensors, std::int64_t dim = 0);

}  // namespace troupe
