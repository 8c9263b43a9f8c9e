// Op layer: tensor factories and random draws. A random draw reserves ceil(numel / 4) Philox
// blocks from the generator (Note [Random formula] in random_formula.hpp). So two draws from
// one generator differ, and the same (seed, offset) gives the same tensor on CPU and CUDA.
#include <cmath>
#include <cstring>
#include <numeric>

#include "../random_formula.hpp"
#include "op_util.hpp"

namespace troupe {

tensor empty(shape_t shape, tensor_options opts) {
  for (auto s : shape)
    if (s < 0) throw error(errc::bad_argument, "empty: negative size in shape " + shape_to_string(shape));
  auto impl = std::make_shared<tensor_impl>();
  const auto nbytes = static_cast<std::size_t>(nbytes_of(shape, opts.dtype));
  impl->storage = storage::make(nbytes, default_allocator(opts.device));
  impl->strides = contiguous_strides(shape);
  impl->sizes = std::move(shape);
  impl->dtype = opts.dtype;
  return tensor(std::move(impl));
}

tensor full(shape_t shape, double value, tensor_options opts) {
  tensor t = empty(std::move(shape), opts);
  TROUPE_DISPATCH(opts.device, fill, t, value);
  return t;
}

tensor zeros(shape_t shape, tensor_options opts) { return full(std::move(shape), 0.0, opts); }
tensor ones(shape_t shape, tensor_options opts) { return full(std::move(shape), 1.0, opts); }
tensor empty_like(const tensor& t) { return empty(t.shape(), tensor_options(t.dtype(), t.device())); }
tensor zeros_like(const tensor& t) { return zeros(t.shape(), tensor_options(t.dtype(), t.device())); }
tensor ones_like(const tensor& t) { return ones(t.shape(), tensor_options(t.dtype(), t.device())); }
tensor scalar_tensor(double value, tensor_options opts) { return full({}, value, opts); }

tensor arange(double start, double end, double step, tensor_options opts) {
  if (step == 0.0 || !std::isfinite(start) || !std::isfinite(end) || !std::isfinite(step) || (end - start) * step < 0)
    throw error(errc::bad_argument, "arange: bad range start=" + std::to_string(start) + " end=" + std::to_string(end) +
                                        " step=" + std::to_string(step));
  const auto integral = [](double v) { return v == std::floor(v); };
  // The default dtype is int64; a non-integral bound or step makes it float32, as in PyTorch.
  if (opts.dtype == dtype::int64 && !(integral(start) && integral(end) && integral(step))) opts.dtype = dtype::float32;
  const auto n = static_cast<std::int64_t>(std::ceil((end - start) / step));
  tensor host = empty({n}, tensor_options(dtype::float64));
  auto* p = static_cast<double*>(host.data_ptr());
  for (std::int64_t i = 0; i < n; ++i) p[i] = start + static_cast<double>(i) * step;
  tensor typed = host.to(opts.dtype);
  return opts.device.is_cpu() ? typed : typed.to(opts.device);
}

tensor arange(double end, tensor_options opts) { return arange(0.0, end, 1.0, opts); }

template <class T>
tensor from_vector(const std::vector<T>& values, shape_t shape) {
  if (numel_of(shape) != static_cast<std::int64_t>(values.size()))
    throw error(errc::shape_mismatch, "from_vector: " + std::to_string(values.size()) + " values do not fill shape " +
                                          shape_to_string(shape));
  tensor t = empty(std::move(shape), tensor_options(dtype_of<T>()));
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(T));
  return t;
}

template tensor from_vector<float>(const std::vector<float>&, shape_t);
template tensor from_vector<double>(const std::vector<double>&, shape_t);
template tensor from_vector<half>(const std::vector<half>&, shape_t);
template tensor from_vector<bfloat16>(const std::vector<bfloat16>&, shape_t);
template tensor from_vector<std::int32_t>(const std::vector<std::int32_t>&, shape_t);
template tensor from_vector<std::int64_t>(const std::vector<std::int64_t>&, shape_t);
template tensor from_vector<std::uint8_t>(const std::vector<std::uint8_t>&, shape_t);

template <>
tensor from_vector<bool>(const std::vector<bool>& values, shape_t shape) {
  if (numel_of(shape) != static_cast<std::int64_t>(values.size()))
    throw error(errc::shape_mismatch, "from_vector: " + std::to_string(values.size()) + " values do not fill shape " +
                                          shape_to_string(shape));
  tensor t = empty(std::move(shape), tensor_options(dtype::boolean));
  bool* p = static_cast<bool*>(t.data_ptr());
  for (std::size_t i = 0; i < values.size(); ++i) p[i] = values[i];
  return t;
}

tensor from_blob(void* data, shape_t shape, dtype t, device d) {
  for (auto s : shape)
    if (s < 0) throw error(errc::bad_argument, "from_blob: negative size in shape " + shape_to_string(shape));
  if (!data && numel_of(shape) > 0) throw error(errc::bad_argument, "from_blob: null data for shape " + shape_to_string(shape));
  auto impl = std::make_shared<tensor_impl>();
  const auto nbytes = static_cast<std::size_t>(nbytes_of(shape, t));
  impl->storage = std::make_shared<storage>(data_ptr(data, d, nullptr, nullptr), nbytes, storage_kind::external);
  impl->strides = contiguous_strides(shape);
  impl->sizes = std::move(shape);
  impl->dtype = t;
  return tensor(std::move(impl));
}

// ---- random ---------------------------------------------------------------------------------

namespace {
void check_floating(const char* op, dtype t) {
  if (!is_floating(t)) throw error(errc::dtype_mismatch, std::string(op) + ": needs a floating dtype, got " + std::string(to_string(t)));
}
std::uint64_t reserve_for(generator& gen, const tensor& t) {
  return gen.reserve(random_formula::blocks_for(static_cast<std::uint64_t>(t.numel())));
}
}  // namespace

tensor& uniform_(tensor& t, generator& gen, double low, double high) {
  ops::check_defined("uniform_", t);
  check_floating("uniform_", t.dtype());
  if (!(low <= high)) throw error(errc::bad_argument, "uniform_: low " + std::to_string(low) + " > high " + std::to_string(high));
  const std::uint64_t offset = reserve_for(gen, t);
  TROUPE_DISPATCH(t.device(), uniform, t, gen.seed(), offset, low, high);
  t.bump_version();
  return t;
}

tensor& normal_(tensor& t, generator& gen, double mean, double std) {
  ops::check_defined("normal_", t);
  check_floating("normal_", t.dtype());
  if (!(std >= 0.0)) throw error(errc::bad_argument, "normal_: std must be >= 0, got " + std::to_string(std));
  const std::uint64_t offset = reserve_for(gen, t);
  TROUPE_DISPATCH(t.device(), normal, t, gen.seed(), offset, mean, std);
  t.bump_version();
  return t;
}

tensor rand(shape_t shape, generator& gen, tensor_options opts, double low, double high) {
  tensor t = empty(std::move(shape), opts);
  return uniform_(t, gen, low, high);
}

tensor randn(shape_t shape, generator& gen, tensor_options opts, double mean, double std) {
  tensor t = empty(std::move(shape), opts);
  return normal_(t, gen, mean, std);
}

tensor randint(std::int64_t low, std::int64_t high, shape_t shape, generator& gen, tensor_options opts) {
  if (high <= low)
    throw error(errc::bad_argument, "randint: empty range [" + std::to_string(low) + ", " + std::to_string(high) + ")");
  tensor t = empty(std::move(shape), opts);
  const std::uint64_t offset = reserve_for(gen, t);
  TROUPE_DISPATCH(t.device(), randint, t, gen.seed(), offset, low, high);
  return t;
}

tensor randperm(std::int64_t n, generator& gen) {
  if (n < 0) throw error(errc::bad_argument, "randperm: negative n " + std::to_string(n));
  tensor t = empty({n}, tensor_options(dtype::int64));
  auto* p = static_cast<std::int64_t*>(t.data_ptr());
  std::iota(p, p + n, std::int64_t{0});
  const std::uint64_t offset = reserve_for(gen, t);
  // Fisher–Yates: position i swaps with j = floor(w(i) * (i + 1) / 2^32).
  for (std::int64_t i = n - 1; i > 0; --i) {
    const std::uint64_t w = random_formula::word_at(gen.seed(), offset, static_cast<std::uint64_t>(i));
    const auto j = static_cast<std::int64_t>((w * static_cast<std::uint64_t>(i + 1)) >> 32);
    std::swap(p[i], p[j]);
  }
  return t;
}

}  // namespace troupe
