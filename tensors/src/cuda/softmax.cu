// softmax / log_softmax along one dim: one block per row (all other indices fixed), three
// passes (max, sum of exp, write), computed in float (double for float64).
#include <limits>

#include "../kernels.hpp"
#include "block_reduce.cuh"

namespace troupe::kernels::cuda {

using namespace troupe::cuda_detail;

namespace {

constexpr int softmax_threads = 256;

struct row_geometry {
  strided<2> rows;  // shape with dim set to 1, strides {out, a}
  std::int64_t n_rows, len, out_stride, a_stride;
};

template <class T>
__global__ void softmax_kernel(T* out, const T* a, row_geometry g, bool log) {
  using A = acc_t<T>;
  __shared__ A shared[32];
  for (std::int64_t r = blockIdx.x; r < g.n_rows; r += gridDim.x) {
    std::int64_t off[2];
    offsets_of(g.rows, r, off);
    const T* x = a + off[1];
    A m = -std::numeric_limits<A>::infinity();
    for (std::int64_t j = threadIdx.x; j < g.len; j += blockDim.x) m = max_op{}(m, load_acc(x[j * g.a_stride]));
    m = block_reduce(m, max_op{}, -std::numeric_limits<A>::infinity(), shared);
    // A row whose max is -inf or NaN: subtracting it would give NaN for finite rows. Torch's
    // behaviour stays: NaN only when the input has NaN or every element is -inf.
    A s = 0;
    for (std::int64_t j = threadIdx.x; j < g.len; j += blockDim.x) s += ::exp(load_acc(x[j * g.a_stride]) - m);
    s = block_reduce(s, sum_op{}, A(0), shared);
    const A log_s = ::log(s);
    for (std::int64_t j = threadIdx.x; j < g.len; j += blockDim.x) {
      const A v = load_acc(x[j * g.a_stride]) - m;
      out[off[0] + j * g.out_stride] = store_as<T>(log ? v - log_s : ::exp(v) / s);
    }
  }
}

}  // namespace

void softmax(const tensor& out, const tensor& a, std::int64_t dim, bool log) {
  if (out.numel() == 0) return;
  row_geometry g{};
  const auto d = static_cast<std::size_t>(a.dim() == 0 ? 0 : dim);
  shape_t row_shape = a.shape();
  if (a.dim() > 0) row_shape[d] = 1;
  g.rows = make_strided<2>(row_shape, {&out.strides(), &a.strides()}, "softmax");
  g.n_rows = numel_of(row_shape);
  g.len = a.dim() == 0 ? 1 : a.shape()[d];
  g.out_stride = a.dim() == 0 ? 0 : out.strides()[d];
  g.a_stride = a.dim() == 0 ? 0 : a.strides()[d];
  const int dev = device_of(out);
  device_guard guard(dev);
  const int blocks = static_cast<int>(std::min<std::int64_t>(g.n_rows, std::int64_t{1} << 20));
  visit_device_dtype(a.dtype(), [&](auto t) {
    using T = typename decltype(t)::type;
    if constexpr (std::is_floating_point_v<acc_t<T>>) {
      softmax_kernel<T><<<blocks, softmax_threads, 0, stream_of(dev)>>>(ptr<T>(out), ptr<T>(a), g, log);
      TROUPE_CUDA_CHECK_LAUNCH();
    } else {
      throw error(errc::dtype_mismatch, std::string("softmax: CUDA kernel needs a floating dtype, got ") +
                                            std::string(to_string(a.dtype())));
    }
  });
}

}  // namespace troupe::kernels::cuda
