// Loss functions built from differentiable tensor ops.
#include "troupe/autograd/nn/loss.hpp"

#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/nn_ops.hpp"
#include "troupe/tensors/reduction.hpp"

namespace troupe::nn {

namespace {
tensor reduce(const tensor& per_element, reduction r) {
  switch (r) {
    case reduction::none: return per_element;
    case reduction::sum: return sum(per_element);
    case reduction::mean: return mean(per_element);
  }
  return per_element;
}
}  // namespace

tensor mse_loss(const tensor& input, const tensor& target, reduction r) {
  if (input.shape() != target.shape())
    throw error(errc::shape_mismatch, "mse_loss: input shape " + shape_to_string(input.shape()) +
                                          " differs from target shape " + shape_to_string(target.shape()));
  if (input.dtype() != target.dtype())
    throw error(errc::dtype_mismatch, "mse_loss: input dtype " + std::string(to_string(input.dtype())) +
                                          " differs from target dtype " + std::string(to_string(target.dtype())));
  const tensor diff = input - target;
  return reduce(diff * diff, r);
}

tensor cross_entropy_loss(const tensor& logits, const tensor& target, reduction r) {
  if (logits.dim() != 2 || target.dim() != 1 || target.size(0) != logits.size(0))
    throw error(errc::shape_mismatch, "cross_entropy_loss: expected logits [N, C] and target [N], got " +
                                          shape_to_string(logits.shape()) + " and " +
                                          shape_to_string(target.shape()));
  if (!is_floating(logits.dtype()) || target.dtype() != dtype::int64)
    throw error(errc::dtype_mismatch, "cross_entropy_loss: expected floating logits and int64 target, got " +
                                          std::string(to_string(logits.dtype())) + " and " +
                                          std::string(to_string(target.dtype())));
  const std::int64_t classes = logits.size(1);
  if (target.numel() > 0) {
    const auto lo = static_cast<std::int64_t>(amin(target).item());
    const auto hi = static_cast<std::int64_t>(amax(target).item());
    if (lo < 0 || hi >= classes)
      throw error(errc::index_out_of_range, "cross_entropy_loss: class " + std::to_string(lo < 0 ? lo : hi) +
                                                " out of range for " + std::to_string(classes) + " classes");
  }
  const tensor picked = gather(log_softmax(logits, 1), 1, target.unsqueeze(1)).squeeze(1);
  return reduce(-picked, r);
}

}  // namespace troupe::nn
