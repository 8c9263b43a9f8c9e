// uniform / normal / randint: the same per-element formula as the CPU (Note [Random formula]
// in random_formula.hpp), so one generator state gives identical tensors on both backends.
#include "../kernels.hpp"
#include "../random_formula.hpp"
#include "common.cuh"

namespace troupe::kernels::cuda {

using namespace troupe::cuda_detail;

namespace {

enum class dist : std::uint8_t { uniform, normal, randint };

struct draw {
  dist kind;
  std::uint64_t seed, offset;
  double p0, p1;       // uniform: low, high; normal: mean, std
  std::int64_t i0, i1;  // randint: low, high
};

template <class T> __device__ inline T value_at(const draw& d, std::uint64_t i) {
  switch (d.kind) {
    case dist::uniform: return store_as<T>(random_formula::uniform_at(d.seed, d.offset, i, d.p0, d.p1));
    case dist::normal: return store_as<T>(random_formula::normal_at(d.seed, d.offset, i, d.p0, d.p1));
    case dist::randint: return store_as<T>(random_formula::randint_at(d.seed, d.offset, i, d.i0, d.i1));
  }
  return T{};
}

// Element i of the draw goes to the element with row-major linear index i of `out`.
template <class T>
__global__ void random_kernel(T* out, draw d, strided<1> g, bool contiguous, std::int64_t n) {
  for (std::int64_t i = global_index(); i < n; i += grid_stride()) {
    std::int64_t off[1] = {i};
    if (!contiguous) offsets_of(g, i, off);
    out[off[0]] = value_at<T>(d, static_cast<std::uint64_t>(i));
  }
}

void generate(const tensor& out, const draw& d) {
  const std::int64_t n = out.numel();
  if (n == 0) return;
  const int dev = device_of(out);
  device_guard guard(dev);
  const bool contiguous = out.is_contiguous();
  const strided<1> g = contiguous ? strided<1>{} : make_strided<1>(out.shape(), {&out.strides()}, "random");
  visit_device_dtype(out.dtype(), [&](auto t) {
    using T = typename decltype(t)::type;
    random_kernel<T><<<grid_for(n, dev), block_threads, 0, stream_of(dev)>>>(ptr<T>(out), d, g, contiguous, n);
    TROUPE_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

void uniform(const tensor& out, std::uint64_t seed, std::uint64_t offset, double low, double high) {
  generate(out, draw{dist::uniform, seed, offset, low, high, 0, 0});
}

void normal(const tensor& out, std::uint64_t seed, std::uint64_t offset, double mean, double std) {
  generate(out, draw{dist::normal, seed, offset, mean, std, 0, 0});
}

void randint(const tensor& out, std::uint64_t seed, std::uint64_t offset, std::int64_t low, std::int64_t high) {
  generate(out, draw{dist::randint, seed, offset, 0.0, 0.0, low, high});
}

}  // namespace troupe::kernels::cuda
