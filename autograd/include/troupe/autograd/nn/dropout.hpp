#pragma once
/// \file dropout.hpp
/// Dropout (torch.nn.Dropout) with an explicit generator.

#include "troupe/autograd/nn/module.hpp"
#include "troupe/tensors/generator.hpp"

namespace troupe::nn {

/// In training mode zeroes each element with probability p and scales the rest by 1 / (1 - p);
/// in eval mode (or p == 0) the identity. The mask is drawn from `gen`, which the module
/// references; the caller keeps it alive. Saving it (save_checkpoint) makes the masks of a
/// resumed run equal to those of an uninterrupted one.
class dropout : public unary_module {
 public:
  /// Throws bad_argument unless 0 <= p < 1.
  dropout(double p, generator& gen);

  tensor forward(const tensor& input) override;

  double p() const noexcept { return p_; }

 private:
  double p_;
  generator* gen_;
};

}  // namespace troupe::nn
