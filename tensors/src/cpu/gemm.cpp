// CPU kernels: batched matrix products.
// float32/float64 go to CBLAS (OpenBLAS). A 2-d operand that is a transpose of a contiguous
// matrix is passed as CblasTrans with its own leading dimension, not copied. Any other layout
// is made contiguous once. Other dtypes use a plain triple loop. It accumulates in float
// (16-bit floats), double or int64. It runs k-inner over a transposed copy of b, so the inner
// loop is unit-stride.
#include <cblas.h>

#include <vector>

#include "../kernels.hpp"
#include "loops.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::kernels::cpu {

namespace {
using namespace detail;

// How one [rows, cols] matrix with strides (rs, cs) can be handed to BLAS in row-major mode.
struct blas_view {
  bool ok = false;
  CBLAS_TRANSPOSE trans = CblasNoTrans;
  std::int64_t ld = 1;
};

blas_view blas_layout(std::int64_t rows, std::int64_t cols, std::int64_t rs, std::int64_t cs) {
  blas_view v;
  if ((cs == 1 || cols <= 1) && (rows <= 1 || rs >= std::max<std::int64_t>(cols, 1))) {
    v.ok = true;
    v.ld = rows <= 1 ? std::max<std::int64_t>(cols, 1) : rs;
  } else if ((rs == 1 || rows <= 1) && (cols <= 1 || cs >= std::max<std::int64_t>(rows, 1))) {
    v.ok = true;
    v.trans = CblasTrans;
    v.ld = cols <= 1 ? std::max<std::int64_t>(rows, 1) : cs;
  }
  return v;
}

// a: [B, n, k]; returns a tensor whose every batch matrix has a BLAS layout (a itself if so).
tensor blas_ready(const tensor& a, blas_view& v) {
  v = blas_layout(a.size(1), a.size(2), a.stride(1), a.stride(2));
  if (v.ok) return a;
  tensor c = empty(a.shape(), tensor_options(a.dtype()));
  copy(c, a);
  v = blas_layout(c.size(1), c.size(2), c.stride(1), c.stride(2));
  return c;
}

template <class T>
void blas_gemm(const tensor& out, const tensor& a0, const tensor& b0, double alpha, double beta) {
  blas_view va, vb;
  const tensor a = blas_ready(a0, va), b = blas_ready(b0, vb);
  const std::int64_t batch = out.size(0), n = out.size(1), m = out.size(2), k = a.size(2);
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = static_cast<const T*>(b.data_ptr());
  T* po = static_cast<T*>(out.data_ptr());
  for (std::int64_t i = 0; i < batch; ++i) {
    const T* ai = pa + i * a.stride(0);
    const T* bi = pb + i * b.stride(0);
    T* oi = po + i * n * m;
    if constexpr (std::is_same_v<T, float>)
      cblas_sgemm(CblasRowMajor, va.trans, vb.trans, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                  static_cast<float>(alpha), ai, static_cast<int>(va.ld), bi, static_cast<int>(vb.ld),
                  static_cast<float>(beta), oi, static_cast<int>(std::max<std::int64_t>(m, 1)));
    else
      cblas_dgemm(CblasRowMajor, va.trans, vb.trans, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                  alpha, ai, static_cast<int>(va.ld), bi, static_cast<int>(vb.ld), beta, oi,
                  static_cast<int>(std::max<std::int64_t>(m, 1)));
  }
}

template <class T>
void loop_gemm(const tensor& out, const tensor& a, const tensor& b, double alpha, double beta) {
  using A = std::conditional_t<std::is_floating_point_v<compute_t<T>>,
                               std::conditional_t<std::is_same_v<T, double>, double, float>, std::int64_t>;
  const std::int64_t batch = out.size(0), n = out.size(1), m = out.size(2), k = a.size(2);
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = static_cast<const T*>(b.data_ptr());
  T* po = static_cast<T*>(out.data_ptr());
  std::vector<A> bt(static_cast<std::size_t>(k * m));  // b[i] transposed to [m, k]
  for (std::int64_t bi = 0; bi < batch; ++bi) {
    for (std::int64_t p = 0; p < k; ++p)
      for (std::int64_t j = 0; j < m; ++j)
        bt[static_cast<std::size_t>(j * k + p)] = static_cast<A>(load(pb + bi * b.stride(0) + p * b.stride(1) + j * b.stride(2)));
    for (std::int64_t i = 0; i < n; ++i)
      for (std::int64_t j = 0; j < m; ++j) {
        A acc{};
        const T* arow = pa + bi * a.stride(0) + i * a.stride(1);
        const A* bcol = bt.data() + j * k;
        for (std::int64_t p = 0; p < k; ++p) acc += static_cast<A>(load(arow + p * a.stride(2))) * bcol[p];
        T* o = po + (bi * n + i) * m + j;
        double r = alpha * static_cast<double>(acc);
        if (beta != 0.0) r += beta * static_cast<double>(load(o));
        store(o, from_double<compute_t<T>>(r));
      }
  }
}
}  // namespace

void gemm(const tensor& out, const tensor& a, const tensor& b, double alpha, double beta) {
  if (out.numel() == 0) return;
  if (a.size(2) == 0) {  // empty inner dimension: the product is zero
    if (beta == 0.0) fill(out, 0.0);
    else if (beta != 1.0) binary_scalar(binary_op::mul, out, out, beta);
    return;
  }
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) blas_gemm<T>(out, a, b, alpha, beta);
    else loop_gemm<T>(out, a, b, alpha, beta);
  });
}

}  // namespace troupe::kernels::cpu
