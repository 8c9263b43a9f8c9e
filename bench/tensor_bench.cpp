// Tensor op throughput against the hardware limits measured in the same run:
//   - sgemm through troupe::matmul vs cblas_sgemm on the same buffers;
//   - elementwise add/relu vs memcpy bandwidth;
//   - add with one transposed (strided) operand.
// Every timed op is checked against a reference.
//
//   tensor_bench [--quick]
//
// Metrics (BENCH.md): sgemm_{256,1024,2048}_gflops, limit_cblas_sgemm_{256,1024,2048}_gflops,
// sgemm_1024_ratio, add_contiguous_gbps, add_inplace_contiguous_gbps, relu_contiguous_gbps,
// add_transposed_gbps, limit_memcpy_gbps. Bandwidth counts bytes read + written per call.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/linalg.hpp"

#if defined(TROUPE_WITH_CUDA)
#if __has_include("cuda_bench_section.hpp")
#include "cuda_bench_section.hpp"
#define TROUPE_TENSOR_BENCH_HAS_CUDA 1
#endif
#endif

using namespace troupe;
namespace tb = troupe::bench;

namespace {

// 32M floats (128 MiB per operand): well beyond any cache.
constexpr std::int64_t rows = 8192, cols = 4096, elems = rows * cols;
constexpr double gb = 1e9;

// Deterministic values in [-0.5, 0.5), different per buffer.
std::vector<float> pattern(std::size_t n, unsigned salt) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i * 2654435761u + salt) % 1000u) * 0.001f - 0.5f;
  return v;
}

[[noreturn]] void wrong(const std::string& what) {
  std::fprintf(stderr, "tensor_bench: WRONG RESULT: %s\n", what.c_str());
  std::exit(1);
}

// Indices to verify: the ends and a stride through the middle.
std::vector<std::int64_t> probe_indices(std::int64_t n) {
  std::vector<std::int64_t> out = {0, n - 1};
  for (std::int64_t i = 7; i < n; i += n / 997 + 1) out.push_back(i);
  return out;
}

void bench_sgemm(tb::report& rep, int n, bool quick) {
  const auto nn = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  std::vector<float> a = pattern(nn, 1), b = pattern(nn, 2), c(nn);
  const tensor ta = from_blob(a.data(), {n, n}, dtype::float32), tbm = from_blob(b.data(), {n, n}, dtype::float32);
  const int iters = quick ? (n >= 2048 ? 2 : 5) : (n >= 2048 ? 6 : n >= 1024 ? 15 : 60);
  tensor out;
  const auto api = tb::summarize(tb::time_runs(2, iters, [&] { out = matmul(ta, tbm); }));
  const auto ref = tb::summarize(tb::time_runs(2, iters, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  }));
  const float* o = out.data<float>();
  for (auto i : probe_indices(static_cast<std::int64_t>(nn))) {
    const auto k = static_cast<std::size_t>(i);
    if (std::fabs(o[k] - c[k]) > 1e-3f * (1.0f + std::fabs(c[k])))
      wrong("matmul " + std::to_string(n) + " element " + std::to_string(i) + ": " + std::to_string(o[k]) + " vs cblas " + std::to_string(c[k]));
  }
  const double flop = 2.0 * n * static_cast<double>(n) * n;
  const std::string params = "\"n\": " + std::to_string(n) + ", \"iters\": " + std::to_string(iters);
  const std::string sz = std::to_string(n);
  rep.add("sgemm_" + sz + "_gflops", flop / api.median / 1e9, "GFLOP/s", params);
  rep.add("limit_cblas_sgemm_" + sz + "_gflops", flop / ref.median / 1e9, "GFLOP/s", params);
  if (n == 1024) rep.add("sgemm_1024_ratio", ref.median / api.median, "ratio", params);
}

struct buffers {
  std::vector<float> a = pattern(static_cast<std::size_t>(elems), 3), b = pattern(static_cast<std::size_t>(elems), 4);
  std::vector<float> dst = std::vector<float>(static_cast<std::size_t>(elems), 0.0f);
  tensor ta = from_blob(a.data(), {rows, cols}, dtype::float32);
  tensor tbf = from_blob(b.data(), {rows, cols}, dtype::float32);
};

std::string bw_params(int iters) {
  return "\"elements\": " + std::to_string(elems) + ", \"dtype\": \"float32\", \"iters\": " + std::to_string(iters);
}

void bench_memcpy(tb::report& rep, buffers& buf, int iters) {
  const std::size_t bytes = static_cast<std::size_t>(elems) * sizeof(float);
  const auto s = tb::summarize(tb::time_runs(1, iters, [&] { std::memcpy(buf.dst.data(), buf.a.data(), bytes); }));
  if (std::memcmp(buf.dst.data(), buf.a.data(), bytes) != 0) wrong("memcpy");
  rep.add("limit_memcpy_gbps", 2.0 * static_cast<double>(bytes) / s.median / gb, "GB/s", bw_params(iters));
}

void bench_add_relu(tb::report& rep, buffers& buf, int iters) {
  const double bytes = static_cast<double>(elems) * sizeof(float);
  tensor out;
  const auto add_s = tb::summarize(tb::time_runs(1, iters, [&] { out = add(buf.ta, buf.tbf); }));
  for (auto i : probe_indices(elems)) {
    const auto k = static_cast<std::size_t>(i);
    if (out.data<float>()[k] != buf.a[k] + buf.b[k]) wrong("add element " + std::to_string(i));
  }
  rep.add("add_contiguous_gbps", 3.0 * bytes / add_s.median / gb, "GB/s", bw_params(iters));

  const auto relu_s = tb::summarize(tb::time_runs(1, iters, [&] { out = relu(buf.ta); }));
  for (auto i : probe_indices(elems)) {
    const auto k = static_cast<std::size_t>(i);
    if (out.data<float>()[k] != std::max(buf.a[k], 0.0f)) wrong("relu element " + std::to_string(i));
  }
  rep.add("relu_contiguous_gbps", 2.0 * bytes / relu_s.median / gb, "GB/s", bw_params(iters));

  // In place (no output allocation): acc += b, checked against the number of additions made.
  std::vector<float> acc_data(static_cast<std::size_t>(elems), 0.0f);
  tensor acc = from_blob(acc_data.data(), {rows, cols}, dtype::float32);
  int calls = 0;
  const auto inplace_s = tb::summarize(tb::time_runs(1, iters, [&] { acc.add_(buf.tbf); ++calls; }));
  for (auto i : probe_indices(elems)) {
    const auto k = static_cast<std::size_t>(i);
    float want = 0.0f;
    for (int c = 0; c < calls; ++c) want += buf.b[k];
    if (acc_data[k] != want) wrong("add_ element " + std::to_string(i));
  }
  rep.add("add_inplace_contiguous_gbps", 3.0 * bytes / inplace_s.median / gb, "GB/s", bw_params(iters));
}

// a [rows, cols] contiguous + b viewed as the transpose of a [cols, rows] buffer.
void bench_add_transposed(tb::report& rep, buffers& buf, int iters) {
  const tensor bt = from_blob(buf.b.data(), {cols, rows}, dtype::float32).t();
  tensor out;
  const auto s = tb::summarize(tb::time_runs(1, iters, [&] { out = add(buf.ta, bt); }));
  const float* o = out.data<float>();
  for (auto i : probe_indices(elems)) {
    const std::int64_t r = i / cols, c = i % cols;
    const auto k = static_cast<std::size_t>(i);
    if (o[k] != buf.a[k] + buf.b[static_cast<std::size_t>(c * rows + r)]) wrong("transposed add element " + std::to_string(i));
  }
  rep.add("add_transposed_gbps", 3.0 * static_cast<double>(elems) * sizeof(float) / s.median / gb, "GB/s", bw_params(iters));
}

}  // namespace

int main(int argc, char** argv) {
  tb::check_args(argc, argv, "tensor_bench",
                 "Tensor op throughput (sgemm, elementwise) against CBLAS and memcpy.");
  const bool quick = tb::quick_mode(argc, argv);
  tb::report rep("tensor");
  try {
    for (int n : {256, 1024, 2048}) bench_sgemm(rep, n, quick);
    buffers buf;
    const int iters = quick ? 3 : 15;
    bench_memcpy(rep, buf, iters);
    bench_add_relu(rep, buf, iters);
    bench_add_transposed(rep, buf, quick ? 2 : 8);
#if defined(TROUPE_TENSOR_BENCH_HAS_CUDA)
    run_cuda_tensor_bench(rep, quick);
#endif
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tensor_bench: %s\n", e.what());
    return 1;
  }
  rep.print_table();
  return 0;
}
