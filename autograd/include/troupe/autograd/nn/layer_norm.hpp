#pragma once
/// \file layer_norm.hpp
/// Layer normalisation over the trailing dims (torch.nn.LayerNorm).

#include "troupe/autograd/nn/module.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::nn {

/// y = (x - mean) / sqrt(var + eps) * weight + bias, with mean and the biased variance taken over
/// the last normalized_shape.size() dims. With elementwise_affine, weight (ones) and bias
/// (zeros) of shape normalized_shape are parameters.
class layer_norm : public unary_module {
 public:
  /// Throws bad_argument for an empty or non-positive normalized_shape or eps <= 0.
  explicit layer_norm(shape_t normalized_shape, double eps = 1e-5, bool elementwise_affine = true,
                      tensor_options opts = {});

  /// Throws shape_mismatch when the input's trailing dims are not normalized_shape.
  tensor forward(const tensor& input) override;

  const shape_t& normalized_shape() const noexcept { return shape_; }
  double eps() const noexcept { return eps_; }

  tensor weight;  ///< normalized_shape, undefined without elementwise_affine
  tensor bias;    ///< normalized_shape, undefined without elementwise_affine

 private:
  shape_t shape_;
  double eps_;
};

}  // namespace troupe::nn
