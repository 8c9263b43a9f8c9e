#pragma once
/// \file embedding.hpp
/// Lookup table of learnable vectors (torch.nn.Embedding).

#include <cstdint>

#include "troupe/autograd/nn/module.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"

namespace troupe::nn {

/// Maps integer indices to rows of `weight` [num_embeddings, embedding_dim], initialised N(0, 1)
/// from `gen` as in PyTorch. The gradient of a row is the sum of the output gradients of every
/// position that looked it up.
class embedding : public unary_module {
 public:
  /// Throws bad_argument for non-positive sizes or a non-floating dtype.
  embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, generator& gen, tensor_options opts = {});

  /// Indices (int64 or int32, any shape) -> shape + [embedding_dim]. Throws dtype_mismatch for a
  /// non-integer index tensor and index_out_of_range for an index outside [0, num_embeddings).
  tensor forward(const tensor& indices) override;

  std::int64_t num_embeddings() const noexcept { return num_; }
  std::int64_t embedding_dim() const noexcept { return dim_; }

  tensor weight;  ///< [num_embeddings, embedding_dim]

 private:
  std::int64_t num_;
  std::int64_t dim_;
};

}  // namespace troupe::nn
