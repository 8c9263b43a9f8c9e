// LayerNorm as a composite of differentiable ops.
#include "troupe/autograd/nn/layer_norm.hpp"

#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/reduction.hpp"

namespace troupe::nn {

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

}  // namespace troupe::nn
