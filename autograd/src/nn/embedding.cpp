// Embedding, LayerNorm and Dropout.
#include "troupe/autograd/nn/embedding.hpp"

#include "troupe/autograd/nn/dropout.hpp"
#include "troupe/autograd/nn/layer_norm.hpp"
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

layer_norm::layer_norm(shape_t normalized_shape, double eps, bool elementwise_affine, tensor_options opts)
    : shape_(std::move(normalized_shape)), eps_(eps) {
  bool ok = !shape_.empty();
  for (auto s : shape_) ok = ok && s > 0;
  if (!ok) throw error(errc::bad_argument, "layer_norm: invalid normalized_shape " + shape_to_string(shape_));
  if (!(eps > 0)) throw error(errc::bad_argument, "layer_norm: eps must be positive, got " + std::to_string(eps));
  if (elementwise_affine) {
    weight = ones(shape_, opts);
    bias = zeros(shape_, opts);
    register_parameter("weight", weight);
    register_parameter("bias", bias);
  }
}

tensor layer_norm::forward(const tensor& input) {
  const auto k = static_cast<std::int64_t>(shape_.size());
  const bool fits = input.dim() >= k &&
                    shape_t(input.shape().end() - k, input.shape().end()) == shape_;
  if (!fits)
    throw error(errc::shape_mismatch, "layer_norm: input of shape " + shape_to_string(input.shape()) +
                                          " does not end in normalized_shape " + shape_to_string(shape_));
  shape_t dims;
  for (std::int64_t d = input.dim() - k; d < input.dim(); ++d) dims.push_back(d);
  // Composite of differentiable ops; the biased variance, as PyTorch normalises with.
  const tensor centered = input - mean(input, dims, true);
  const tensor var = mean(centered * centered, dims, true);
  tensor y = centered * rsqrt(var + eps_);
  if (weight.defined()) y = y * weight + bias;
  return y;
}

dropout::dropout(double p, generator& gen) : p_(p), gen_(&gen) {
  if (!(p >= 0.0 && p < 1.0))
    throw error(errc::bad_argument, "dropout: p must be in [0, 1), got " + std::to_string(p));
}

tensor dropout::forward(const tensor& input) {
  if (!is_training() || p_ == 0.0) return input;
  // keep = U[0,1) >= p, so P(keep) = 1 - p; kept values are scaled to preserve the expectation.
  const tensor u = troupe::rand(input.shape(), *gen_, tensor_options(input.dtype(), input.device()));
  const tensor scale = ge(u, p_).to(input.dtype()) * (1.0 / (1.0 - p_));
  return input * scale;
}

}  // namespace troupe::nn
