#pragma once
/// \file factories.hpp
/// Tensor factories. All block until the data is written (CUDA: enqueued on the current stream).

#include <cstdint>
#include <vector>

#include "troupe/tensors/generator.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe {

/// dtype + device of a new tensor.
struct tensor_options {
  troupe::dtype dtype = troupe::dtype::float32;
  troupe::device device = cpu_device;
  tensor_options() = default;
  tensor_options(troupe::dtype t) : dtype(t) {}  // NOLINT: implicit by design
  tensor_options(troupe::dtype t, troupe::device d) : dtype(t), device(d) {}
};

/// Uninitialised tensor with contiguous strides.
tensor empty(shape_t shape, tensor_options opts = {});
tensor zeros(shape_t shape, tensor_options opts = {});
tensor ones(shape_t shape, tensor_options opts = {});
tensor full(shape_t shape, double value, tensor_options opts = {});
tensor empty_like(const tensor& t);
tensor zeros_like(const tensor& t);
tensor ones_like(const tensor& t);
/// 0-d tensor holding `value`.
tensor scalar_tensor(double value, tensor_options opts = {});
/// [start, end) with `step` (default int64 when all are integral, else float32 unless opts say).
tensor arange(double start, double end, double step = 1.0, tensor_options opts = {troupe::dtype::int64});
tensor arange(double end, tensor_options opts = {troupe::dtype::int64});

/// Copies `values` into a new CPU tensor of shape `shape` (numel must match) and dtype of T.
template <class T>
tensor from_vector(const std::vector<T>& values, shape_t shape);
/// 1-d form.
template <class T>
tensor from_vector(const std::vector<T>& values) { return from_vector(values, {static_cast<std::int64_t>(values.size())}); }
/// Wraps external memory without copying; the caller keeps it alive (storage_kind::external).
tensor from_blob(void* data, shape_t shape, troupe::dtype t, troupe::device d = cpu_device);

/// Uniform in [low, high) — same values for the same generator state on CPU and CUDA.
tensor rand(shape_t shape, generator& gen, tensor_options opts = {}, double low = 0.0, double high = 1.0);
/// Standard normal (Box–Muller on Philox output), times std plus mean.
tensor randn(shape_t shape, generator& gen, tensor_options opts = {}, double mean = 0.0, double std = 1.0);
/// Integers uniform in [low, high).
tensor randint(std::int64_t low, std::int64_t high, shape_t shape, generator& gen,
               tensor_options opts = {troupe::dtype::int64});
/// In-place forms used by initialisers (uniform_/normal_ of PyTorch).
tensor& uniform_(tensor& t, generator& gen, double low = 0.0, double high = 1.0);
tensor& normal_(tensor& t, generator& gen, double mean = 0.0, double std = 1.0);
/// A random permutation of [0, n) (int64).
tensor randperm(std::int64_t n, generator& gen);

extern template tensor from_vector<float>(const std::vector<float>&, shape_t);
extern template tensor from_vector<double>(const std::vector<double>&, shape_t);
extern template tensor from_vector<half>(const std::vector<half>&, shape_t);
extern template tensor from_vector<bfloat16>(const std::vector<bfloat16>&, shape_t);
extern template tensor from_vector<std::int32_t>(const std::vector<std::int32_t>&, shape_t);
extern template tensor from_vector<std::int64_t>(const std::vector<std::int64_t>&, shape_t);
extern template tensor from_vector<std::uint8_t>(const std::vector<std::uint8_t>&, shape_t);
template <> tensor from_vector<bool>(const std::vector<bool>& values, shape_t shape);

}  // namespace troupe
