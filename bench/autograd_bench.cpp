// Autograd overhead: one training step (forward, backward, SGD) of an MLP 1024-1024-1024-10 at
// batch 64 through Troupe's modules and engine. The limit is the same GEMMs called directly
// through cblas_sgemm in the same run: the hardware limit for this step.
//
//   autograd_bench [--quick]
//
// Metrics (BENCH.md): mlp_step_ms, mlp_steps_per_s, limit_mlp_cblas_ms, mlp_overhead_ratio.
#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "bench_util.hpp"
#include "troupe/autograd/nn/activation.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/nn/loss.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"

using namespace troupe;

namespace {

constexpr int batch = 64, width = 1024, classes = 10;

// C[m, n] = op(A) op(B), row-major, with op = transpose where asked.
void gemm(bool ta, bool tb, int m, int n, int k, const float* a, const float* b, float* c) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a,
              ta ? m : k, b, tb ? k : n, 0.0f, c, n);
}

// The 8 GEMMs of one step with the MLP's shapes: 3 forward, 5 backward (no gradient for x).
struct cblas_step {
  std::vector<float> x, w1, w2, w3, h1, h2, out, g3, g2, g1, dw1, dw2, dw3;
  cblas_step()
      : x(batch * width, 0.01f), w1(width * width, 0.01f), w2(width * width, 0.01f), w3(classes * width, 0.01f),
        h1(batch * width), h2(batch * width), out(batch * classes), g3(batch * classes, 0.1f), g2(batch * width),
        g1(batch * width), dw1(width * width), dw2(width * width), dw3(classes * width) {}
  void run() {
    gemm(false, true, batch, width, width, x.data(), w1.data(), h1.data());        // h1 = x W1^T
    gemm(false, true, batch, width, width, h1.data(), w2.data(), h2.data());       // h2 = h1 W2^T
    gemm(false, true, batch, classes, width, h2.data(), w3.data(), out.data());    // out = h2 W3^T
    gemm(true, false, classes, width, batch, g3.data(), h2.data(), dw3.data());    // dW3 = g3^T h2
    gemm(false, false, batch, width, classes, g3.data(), w3.data(), g2.data());    // dh2 = g3 W3
    gemm(true, false, width, width, batch, g2.data(), h1.data(), dw2.data());      // dW2 = g2^T h1
    gemm(false, false, batch, width, width, g2.data(), w2.data(), g1.data());      // dh1 = g2 W2
    gemm(true, false, width, width, batch, g1.data(), x.data(), dw1.data());       // dW1 = g1^T x
  }
};

// Reference forward through cblas + loops, to check the module's output beside the timing.
std::vector<float> reference_forward(const nn::sequential& mlp, const tensor& x) {
  auto params = mlp.parameters();  // w1 b1 w2 b2 w3 b3
  std::vector<float> a(x.data<float>(), x.data<float>() + x.numel());
  int in = width;
  for (int layer = 0; layer < 3; ++layer) {
    const tensor& w = params[2 * layer];
    const tensor& b = params[2 * layer + 1];
    const int out = static_cast<int>(w.size(0));
    std::vector<float> next(static_cast<std::size_t>(batch * out));
    gemm(false, true, batch, out, in, a.data(), w.data<float>(), next.data());
    for (int i = 0; i < batch; ++i)
      for (int j = 0; j < out; ++j) {
        float& v = next[static_cast<std::size_t>(i * out + j)];
        v += b.data<float>()[j];
        if (layer < 2) v = v > 0 ? v : 0;
      }
    a.swap(next);
    in = out;
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  bench::check_args(argc, argv, "autograd_bench",
                    "One MLP training step through the autograd engine against the same GEMMs through CBLAS.");
  const bool quick = bench::quick_mode(argc, argv);
  const int warmup = quick ? 2 : 5, iters = quick ? 10 : 60;
  generator gen(0);
  nn::sequential mlp(std::make_shared<nn::linear>(width, width, gen), std::make_shared<nn::relu>(),
                     std::make_shared<nn::linear>(width, width, gen), std::make_shared<nn::relu>(),
                     std::make_shared<nn::linear>(width, classes, gen));
  optim::sgd opt(mlp.parameters(), {.lr = 1e-3});
  const tensor x = randn({batch, width}, gen);
  const tensor y = randint(0, classes, {batch}, gen);

  // Correctness beside the timing: the module's forward equals the cblas reference.
  {
    no_grad_guard guard;
    const tensor got = mlp.forward(x);
    const auto want = reference_forward(mlp, x);
    if (!allclose(got, from_vector(want, {batch, classes}), 1e-4, 1e-5)) {
      std::fprintf(stderr, "autograd_bench: module forward differs from the cblas reference\n");
      return 1;
    }
  }
  const auto step = [&] {
    opt.zero_grad();
    backward(nn::cross_entropy_loss(mlp.forward(x), y));
    opt.step();
  };
  // Interleaved, so both sides see the same machine load (the CPU may be shared).
  cblas_step limit;
  std::vector<double> troupe_times, cblas_times;
  for (int i = 0; i < warmup + iters; ++i) {
    const auto t0 = bench::clock::now();
    step();
    const double t_step = bench::seconds_since(t0);
    const auto t1 = bench::clock::now();
    limit.run();
    const double t_cblas = bench::seconds_since(t1);
    if (i < warmup) continue;
    troupe_times.push_back(t_step);
    cblas_times.push_back(t_cblas);
  }
  const auto troupe_stats = bench::summarize(troupe_times);
  const auto cblas_stats = bench::summarize(cblas_times);
  const std::string params = "\"batch\": 64, \"sizes\": \"1024-1024-1024-10\", \"iters\": " + std::to_string(iters);
  bench::report rep("autograd");
  rep.add("mlp_step_ms", troupe_stats.median * 1e3, "ms", params);
  rep.add("mlp_step_p99_ms", troupe_stats.p99 * 1e3, "ms", params);
  rep.add("mlp_steps_per_s", 1.0 / troupe_stats.median, "steps/s", params);
  rep.add("limit_mlp_cblas_ms", cblas_stats.median * 1e3, "ms", params);
  rep.add("mlp_overhead_ratio", troupe_stats.median / cblas_stats.median, "ratio", params);
  rep.print_table();
  return 0;
}
