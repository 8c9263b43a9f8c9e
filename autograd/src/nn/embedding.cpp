// Embedding: index_select of weight rows.
#include "troupe/autograd/nn/embedding.hpp"

#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/nn_ops.hpp"
#include "troupe/tensors/reduction.hpp"

namespace troupe::nn {

embedding::embedding(std::int64_t num_embeddings, std::int64_t embedding_dim, generator& gen, tensor_options opts)
    : num_(num_embeddings), dim_(embedding_dim) {
  if (num_embeddings <= 0 || embedding_dim <= 0)
    throw error(errc::bad_argument, "embedding: sizes must be positive, got " + std::to_string(num_embeddings) +
                                        " x " + std::to_string(embedding_dim));
  if (!is_floating(opts.dtype))
    throw error(errc::bad_argument, "embedding: weight needs a floating dtype, got " +
                                        std::string(troupe::to_string(opts.dtype)));
  weight = randn({num_embeddings, embedding_dim}, gen, opts);
  register_parameter("weight", weight);
}

tensor embedding::forward(const tensor& indices) {
  if (indices.dtype() != dtype::int64 && indices.dtype() != dtype::int32)
    throw error(errc::dtype_mismatch, "embedding: indices must be int64 or int32, got " +
                                          std::string(troupe::to_string(indices.dtype())));
  const tensor flat = indices.reshape({-1});
  if (flat.numel() > 0) {
    const auto lo = static_cast<std::int64_t>(amin(flat).item());
    const auto hi = static_cast<std::int64_t>(amax(flat).item());
    if (lo < 0 || hi >= num_)
      throw error(errc::index_out_of_range, "embedding: index " + std::to_string(lo < 0 ? lo : hi) +
                                                " out of range for " + std::to_string(num_) + " embeddings");
  }
  shape_t out_shape = indices.shape();
  out_shape.push_back(dim_);
  return index_select(weight, 0, flat).view(out_shape);
}

}  // namespace troupe::nn
