// Conversion and copy methods of tensor: contiguous, clone, to (dtype or device), copy_, item.
// Each records autograd like a view (Note [Op recording]) when the result is differentiable.
#include "kernels.hpp"
#include "ops/op_util.hpp"
#include "record_view.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/reduction.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe {

tensor tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

tensor tensor::clone() const {
  tensor out = empty(shape(), tensor_options(dtype(), device()));
  {
    no_grad_guard g;
    TROUPE_DISPATCH(device(), copy, out, *this);
  }
  detail::record_view("clone", *this, out, [](const tensor& g) { return g; });
  return out;
}

tensor tensor::to(troupe::dtype t) const {
  if (t == dtype()) return *this;
  tensor out = empty(shape(), tensor_options(t, device()));
  TROUPE_DISPATCH(device(), copy, out, *this);
  if (is_floating(t)) {
    detail::record_view("to", *this, out, [from = dtype()](const tensor& g) { return g.to(from); });
  }
  return out;
}

tensor tensor::to(troupe::device d) const {
  if (d == device()) return *this;
#if defined(TROUPE_WITH_CUDA)
  tensor src = contiguous();
  tensor out = empty(shape(), tensor_options(dtype(), d));
  kernels::cuda::copy_between_devices(out, src);
  detail::record_view("to_device", *this, out, [from = device()](const tensor& g) { return g.to(from); });
  return out;
#else
  detail::no_cuda("to(device)");
#endif
}

tensor& tensor::copy_(const tensor& src) {
  if (!src.defined()) throw error(errc::invalid_state, "copy_: source tensor is undefined");
  const shape_t b = broadcast_shapes(shape(), src.shape(), "copy_");
  if (b != shape())
    throw error(errc::shape_mismatch, "copy_: source of shape " + shape_to_string(src.shape()) +
                                          " does not broadcast to destination shape " + shape_to_string(shape()));
  check_in_place(*this, {&src}, "copy_");
  const bool rec = should_record({this, &src});
  tensor s = src.expand(shape()).detach();
  if (s.device() != device()) {
#if defined(TROUPE_WITH_CUDA)
    tensor staged = s.contiguous().to(device());
    TROUPE_DISPATCH(device(), copy, *this, staged);
#else
    detail::no_cuda("copy_");
#endif
  } else if (s.storage() == storage()) {
    tensor tmp = s.clone();  // overlapping source: copy through a temporary
    TROUPE_DISPATCH(device(), copy, *this, tmp);
  } else {
    TROUPE_DISPATCH(device(), copy, *this, s);
  }
  bump_version();
  if (rec) {
    op_record r;
    r.name = "copy_";
    r.inputs = {*this, src};
    r.outputs = {*this};
    r.in_place = true;
    r.backward = [src_shape = src.shape(), src_dtype = src.dtype()](const backward_ctx& ctx) -> tensor_list {
      const tensor& g = ctx.grad_outputs[0];
      if (!g.defined()) return {tensor(), tensor()};
      return {tensor(), sum_to(g, src_shape).to(src_dtype)};
    };
    record_op(std::move(r));
  }
  return *this;
}

double tensor::item() const {
  if (numel() != 1)
    throw error(errc::bad_argument, "item: expects a tensor with one element, got " + ops::describe(*this));
  const tensor host = is_cpu() ? *this : cpu();
  return visit_dtype(dtype(), [&](auto tag) { return to_double(*static_cast<const decltype(tag)*>(host.data_ptr())); });
}

}  // namespace troupe
