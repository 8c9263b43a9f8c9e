// Linear: one recorded op over addmm.
#include "troupe/autograd/nn/linear.hpp"

#include <cmath>

#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/reduction.hpp"

namespace troupe::nn {

linear::linear(std::int64_t in_features, std::int64_t out_features, generator& gen, bool with_bias,
               tensor_options opts)
    : in_(in_features), out_(out_features) {
  if (in_features <= 0 || out_features <= 0)
    throw error(errc::bad_argument, "linear: feature counts must be positive, got in=" +
                                        std::to_string(in_features) + " out=" + std::to_string(out_features));
  if (!is_floating(opts.dtype))
    throw error(errc::bad_argument, "linear: parameters need a floating dtype, got " +
                                        std::string(troupe::to_string(opts.dtype)));
  // kaiming_uniform(a=sqrt(5)): gain = sqrt(2 / (1 + 5)), bound = gain * sqrt(3 / fan_in)
  // = 1 / sqrt(fan_in); the bias uses the same bound.
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_features));
  weight = empty({out_features, in_features}, opts);
  uniform_(weight, gen, -bound, bound);
  register_parameter("weight", weight);
  if (with_bias) {
    bias = empty({out_features}, opts);
    uniform_(bias, gen, -bound, bound);
    register_parameter("bias", bias);
  }
}

namespace {

// y = x W^T + b for a 2-d x as one recorded op. So the weight gradient comes out as one
// contiguous GEMM g^T x of W's shape. Through the transpose view it would be a strided
// transpose of x^T g, and accumulating that into .grad is a slow strided add.
tensor linear_2d(const tensor& x, const tensor& w, const tensor& b) {
  tensor out;
  {
    no_grad_guard guard;
    out = b.defined() ? addmm(b, x, w.t()) : matmul(x, w.t());
  }
  if (!should_record({&x, &w, &b})) return out;
  op_record rec;
  rec.name = "linear";
  rec.inputs = {x, w, b};
  rec.outputs = {out};
  rec.saved = {x, w};
  rec.backward = [](const backward_ctx& ctx) -> tensor_list {
    const tensor& g = ctx.grad_outputs[0];
    if (!g.defined()) return tensor_list(3);
    tensor gx, gw, gb;
    if (ctx.needs_input_grad[0]) gx = matmul(g, ctx.saved[1]);
    if (ctx.needs_input_grad[1]) gw = matmul(g.t(), ctx.saved[0]);
    if (ctx.needs_input_grad[2]) gb = sum(g, {0});
    return {gx, gw, gb};
  };
  record_op(std::move(rec));
  return out;
}

}  // namespace

tensor linear::forward(const tensor& input) {
  if (input.dim() < 1 || input.size(-1) != in_)
    throw error(errc::shape_mismatch, "linear: input of shape " + shape_to_string(input.shape()) +
                                          " does not end in in_features = " + std::to_string(in_) +
                                          " (weight " + shape_to_string(weight.shape()) + ")");
  if (input.dim() == 2) return linear_2d(input, weight, bias);
  shape_t out_shape = input.shape();
  out_shape.back() = out_;
  return linear_2d(input.reshape({-1, in_}), weight, bias).reshape(out_shape);
}

}  // namespace troupe::nn
