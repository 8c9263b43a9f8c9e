#pragma once
/// \file linear.hpp
/// Fully connected layer y = x W^T + b (torch.nn.Linear).

#include <cstdint>

#include "troupe/autograd/nn/module.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"

namespace troupe::nn {

/// y = x W^T + b with W of shape [out_features, in_features] and b of shape [out_features].
/// Initialised like PyTorch: kaiming_uniform(a = sqrt(5)) for W, i.e. U(-1/sqrt(in), 1/sqrt(in)),
/// and U(-1/sqrt(in), 1/sqrt(in)) for b, drawn from `gen` (W first, then b).
class linear : public unary_module {
 public:
  /// Throws bad_argument for non-positive feature counts or a non-floating dtype.
  linear(std::int64_t in_features, std::int64_t out_features, generator& gen, bool bias = true,
         tensor_options opts = {});

  /// Input [..., in_features] -> [..., out_features]; shape_mismatch naming both shapes otherwise.
  tensor forward(const tensor& input) override;

  std::int64_t in_features() const noexcept { return in_; }
  std::int64_t out_features() const noexcept { return out_; }

  tensor weight;  ///< [out_features, in_features]
  tensor bias;    ///< [out_features], undefined when built without bias

 private:
  std::int64_t in_;
  std::int64_t out_;
};

}  // namespace troupe::nn
