// Dropout with a caller-owned generator.
#include "troupe/autograd/nn/dropout.hpp"

#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::nn {

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
