// GPU benchmarks beyond the tensor bench's CUDA section, each beside its limit in the same run:
//   - bf16 GEMM through the tensor API vs a direct cublasGemmEx;
//   - NCCL allreduce on one GPU (world size 1) vs a device-to-device copy of the same bytes;
//   - a DDP training step of the MLP 1024-1024-1024-10 batch 64 over the NCCL group vs the same
//     step without DDP.
// Metrics: cuda_bf16_gemm_4096_tflops, limit_cublas_bf16_gemm_4096_tflops,
//   cuda_nccl_allreduce_{1,100}mb_1r_ms, limit_cuda_d2d_100mb_ms, cuda_ddp_step_ms,
//   limit_cuda_local_step_ms. A build without CUDA or NCCL, or a machine without a device,
//   prints why and exits 0 with no figures.
#include "bench_util.hpp"
#include "troupe/ddp/nccl_process_group.hpp"

#if defined(TROUPE_WITH_CUDA) && defined(TROUPE_WITH_NCCL)
#include "cuda_bench_section.hpp"
#include "troupe/autograd/nn/activation.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/nn/loss.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/ddp/distributed_data_parallel.hpp"
#include "troupe/ddp/file_store.hpp"

using namespace troupe;
namespace tb = troupe::bench;
using tb::cuda_section::check;
using tb::cuda_section::time_gpu;

namespace {

void bench_bf16_gemm(tb::report& r, bool quick) {
  const int n = 4096;
  generator gen(3);
  const tensor_options bf{dtype::bfloat16, cuda_device(0)};
  const tensor a = rand({n, n}, gen, tensor_options(dtype::float32, cuda_device(0)), -1.0, 1.0).to(dtype::bfloat16);
  const tensor b = rand({n, n}, gen, tensor_options(dtype::float32, cuda_device(0)), -1.0, 1.0).to(dtype::bfloat16);
  tensor c = empty({n, n}, bf);
  const int iters = quick ? 3 : 30;
  tensor api_out;
  const tb::stats api = time_gpu(2, iters, [&] { api_out = matmul(a, b); });
  tb::cuda_section::cublas_handle h;
  check(cublasSetStream(h.get(), nullptr), "cublasSetStream");
  const float one = 1.0f, zero = 0.0f;
  const tb::stats direct = time_gpu(2, iters, [&] {  // row-major C = A B as column-major C^T = B^T A^T
    check(cublasGemmEx(h.get(), CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b.data_ptr(), CUDA_R_16BF, n, a.data_ptr(),
                       CUDA_R_16BF, n, &zero, c.data_ptr(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  });
  const double err = amax(abs(sub(api_out.to(dtype::float32), c.to(dtype::float32)))).item();
  const double flop = 2.0 * n * static_cast<double>(n) * n;
  const std::string params = "\"n\": 4096, \"iters\": " + std::to_string(iters) + ", \"max_abs_diff\": " + std::to_string(err);
  r.add("cuda_bf16_gemm_4096_tflops", flop / (api.median * 1e-3) / 1e12, "TFLOP/s", params);
  r.add("limit_cublas_bf16_gemm_4096_tflops", flop / (direct.median * 1e-3) / 1e12, "TFLOP/s", params);
  if (!(err < 1.0)) std::printf("WARNING: bf16 matmul differs from cublasGemmEx by %g\n", err);
}

void bench_allreduce(tb::report& r, ddp::nccl_process_group& pg, bool quick) {
  for (const std::int64_t mb : {1, 100}) {
    const std::int64_t n = mb * (std::int64_t{1} << 20) / 4;
    tensor t = ones({n}, {dtype::float32, cuda_device(0)});
    tensor d = empty({n}, {dtype::float32, cuda_device(0)});
    const int iters = quick ? 3 : 50;
    const tb::stats ar = time_gpu(3, iters, [&] { pg.allreduce(t).wait(std::chrono::seconds(60)); });
    const double v = t.cpu().data<float>()[n - 1];  // world size 1: sum of one rank
    const std::string params = "\"mb\": " + std::to_string(mb) + ", \"iters\": " + std::to_string(iters) + ", \"last\": " + std::to_string(v);
    r.add("cuda_nccl_allreduce_" + std::to_string(mb) + "mb_1r_ms", ar.median, "ms", params);
    if (mb == 100) {
      const tb::stats cp = time_gpu(3, iters, [&] {
        check(cudaMemcpyAsync(d.data_ptr(), t.data_ptr(), static_cast<std::size_t>(n) * 4, cudaMemcpyDeviceToDevice, nullptr),
              "cudaMemcpyAsync");
      });
      r.add("limit_cuda_d2d_100mb_ms", cp.median, "ms", params);
    }
    if (v != 1.0) std::printf("WARNING: allreduce on one rank changed the values (%g)\n", v);
  }
}

std::shared_ptr<nn::sequential> make_mlp() {
  generator gen(0);
  auto m = std::make_shared<nn::sequential>(std::make_shared<nn::linear>(1024, 1024, gen), std::make_shared<nn::relu>(),
                                            std::make_shared<nn::linear>(1024, 1024, gen), std::make_shared<nn::relu>(),
                                            std::make_shared<nn::linear>(1024, 10, gen));
  m->to(cuda_device(0));
  return m;
}

void bench_ddp_step(tb::report& r, ddp::nccl_process_group& pg, bool quick) {
  generator gen(1);
  const tensor x = randn({64, 1024}, gen).to(cuda_device(0));
  const tensor y = randint(0, 10, {64}, gen).to(cuda_device(0));
  auto local = make_mlp(), wrapped = make_mlp();
  optim::sgd local_opt(local->parameters(), {.lr = 1e-3});
  ddp::distributed_data_parallel d(wrapped, pg);
  optim::sgd ddp_opt(wrapped->parameters(), {.lr = 1e-3});
  const int warmup = quick ? 2 : 10, iters = quick ? 5 : 100;
  auto step = [&](auto& forward, optim::sgd& opt) {
    opt.zero_grad();
    backward(nn::cross_entropy_loss(forward(x), y));
    opt.step();
    cuda::synchronize(0);
  };
  auto local_fwd = [&](const tensor& in) { return local->forward(in); };
  auto ddp_fwd = [&](const tensor& in) { return d(in); };
  const tb::stats base = tb::summarize(tb::time_runs(warmup, iters, [&] { step(local_fwd, local_opt); }));
  const tb::stats with = tb::summarize(tb::time_runs(warmup, iters, [&] { step(ddp_fwd, ddp_opt); }));
  const std::string params = "\"batch\": 64, \"sizes\": \"1024-1024-1024-10\", \"iters\": " + std::to_string(iters);
  r.add("cuda_ddp_step_ms", with.median * 1e3, "ms", params);
  r.add("limit_cuda_local_step_ms", base.median * 1e3, "ms", params);
}

}  // namespace

int main(int argc, char** argv) {
  tb::check_args(argc, argv, "gpu_bench", "bf16 GEMM vs cuBLAS, NCCL allreduce on one GPU, DDP step over NCCL.");
  const bool quick = tb::quick_mode(argc, argv);
  if (cuda::device_count() == 0) {
    std::printf("no CUDA device: GPU benchmarks skipped\n");
    return 0;
  }
  tb::report r("gpu");
  bench_bf16_gemm(r, quick);
  const ddp::file_store store = ddp::file_store::make_temp();
  {
    ddp::process_group_options o;
    ddp::nccl_process_group pg(store, 0, 1, "gpu-bench", cuda_device(0), o);
    bench_allreduce(r, pg, quick);
    bench_ddp_step(r, pg, quick);
  }
  store.remove_dir();
  r.print_table();
  return 0;
}

#else

int main(int argc, char** argv) {
  troupe::bench::check_args(argc, argv, "gpu_bench", "bf16 GEMM vs cuBLAS, NCCL allreduce on one GPU, DDP step over NCCL.");
  std::printf("this build has no CUDA or no NCCL: GPU benchmarks skipped\n");
  return 0;
}

#endif
