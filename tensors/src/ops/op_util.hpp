#pragma once
// Private: helpers shared by the op layer (tensors/src/ops/*.cpp). They are:
// - input validation, with messages naming op, shapes, dtypes and devices;
// - dtype casts that record no autograd;
// - the one-line autograd recording helper (Note [Op recording] in autograd_hook.hpp).

#include <string>
#include <utility>

#include "../kernels.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/reduction.hpp"

namespace troupe::ops {

/// "float32[2, 3] on cpu"
inline std::string describe(const tensor& t) {
  if (!t.defined()) return "undefined tensor";
  return std::string(to_string(t.dtype())) + shape_to_string(t.shape()) + " on " + to_string(t.device());
}

inline void check_defined(const char* op, const tensor& t) {
  if (!t.defined()) throw error(errc::invalid_state, std::string(op) + ": undefined tensor argument");
}

inline void check_same_device(const char* op, const tensor& a, const tensor& b) {
  check_defined(op, a);
  check_defined(op, b);
  if (a.device() != b.device())
    throw error(errc::device_mismatch, std::string(op) + ": operands on different devices: " + describe(a) + " and " + describe(b));
}

/// `t` converted to dtype `d` without recording autograd (t itself when already `d`).
inline tensor cast(const tensor& t, dtype d) {
  if (t.dtype() == d) return t;
  no_grad_guard g;
  return t.to(d);
}

/// A view of `t` broadcast to `shape`, without recording autograd.
inline tensor expand_to(const tensor& t, const shape_t& shape) {
  if (t.shape() == shape) return t;
  no_grad_guard g;
  return t.expand(shape);
}

/// Geometry-only view (no autograd): used to hand kernels keepdim/3-d forms of outputs.
inline tensor raw_view(const tensor& t, shape_t sizes) {
  return make_view(t, sizes, contiguous_strides(sizes), t.storage_offset());
}

/// A gradient brought back to an input's shape (undoing broadcasting) and dtype.
inline tensor reduce_grad(const tensor& g, const shape_t& shape, dtype t) {
  if (!g.defined()) return g;
  return cast(sum_to(g, shape), t);
}

/// Records `out = name(inputs)` with `saved` and backward `bw` when recording is on.
inline void record(const char* name, tensor_list inputs, const tensor& out, tensor_list saved, backward_fn bw,
                   bool in_place = false) {
  if (!should_record(inputs)) return;
  op_record rec;
  rec.name = name;
  rec.inputs = std::move(inputs);
  rec.outputs = {out};
  rec.saved = std::move(saved);
  rec.backward = std::move(bw);
  rec.in_place = in_place;
  record_op(std::move(rec));
}

/// Sorted, unique, wrapped dims (all dims when `dims` is empty); bad_argument on repeats.
shape_t normalize_dims(const char* op, const tensor& a, const shape_t& dims);
/// `sizes` with every dim in (sorted) `dims` set to 1 (keepdim form) or removed.
shape_t reduced_shape(const shape_t& sizes, const shape_t& dims, bool keepdim);

}  // namespace troupe::ops
