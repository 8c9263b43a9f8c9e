#pragma once
/// \file activation.hpp
/// Parameter-free activation layers; each wraps the elementwise op of the same name.

#include "troupe/autograd/nn/module.hpp"

namespace troupe::nn {

/// max(x, 0).
class relu : public unary_module {
 public:
  tensor forward(const tensor& input) override;
};

/// Hyperbolic tangent.
class tanh : public unary_module {
 public:
  tensor forward(const tensor& input) override;
};

/// Logistic sigmoid 1 / (1 + exp(-x)).
class sigmoid : public unary_module {
 public:
  tensor forward(const tensor& input) override;
};

/// GELU, exact erf form (torch.nn.GELU's default).
class gelu : public unary_module {
 public:
  tensor forward(const tensor& input) override;
};

}  // namespace troupe::nn
