// Distributed autograd with CUDA tensors (Note [Gradients keep their device], Note [rpc device
// map]). A forward whose tensors cross workers on the device gives the gradients of the local
// computation. Each gradient is on the device of its tensor. Needs a GPU: skips visibly without.
#include <catch2/catch.hpp>

#include "dist_autograd/dist_job.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/tensors/cuda.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/reduction.hpp"

using troupe::tensor;
namespace da = troupe::dist_autograd;

namespace {

// A leaf that requires grad, of normal values drawn from `seed`, on `dev`.
tensor random_leaf(troupe::shape_t shape, std::uint64_t seed, troupe::device dev = troupe::cpu_device) {
  troupe::generator gen(seed);
  tensor t = troupe::randn(std::move(shape), gen).to(dev);
  troupe::set_requires_grad(t);
  return t;
}
// The largest absolute difference of two tensors relative to the largest value of `ref`, on the CPU.
double relative_diff(const tensor& a, const tensor& ref) {
  const double scale = troupe::amax(troupe::abs(ref)).item<double>();
  return troupe::amax(troupe::abs(troupe::sub(a.cpu(), ref))).item<double>() / scale;
}

}  // namespace

TEST_CASE("a forward that crosses workers on the device gives the local gradients, each on its tensor's device",
          "[dist_autograd][cuda]") {
  if (troupe::cuda::device_count() == 0) {
    WARN("no CUDA device: skipped");
    return;
  }
  const auto dev = troupe::cuda_device(0);
  troupe::test::dist_job job{2};
  job.at(0).set_device_map("worker1", {{0, 0}});
  job.at(1).set_device_map("worker0", {{0, 0}});
  tensor w = random_leaf({64, 32}, 11, dev);
  job.at(1).functions().add("fwd", [&w](tensor x) {
    REQUIRE(x.device().is_cuda());
    return troupe::matmul(x, w);  // on the device
  });
  // The local reference, on the CPU.
  tensor xl = random_leaf({16, 64}, 5), wl = random_leaf({64, 32}, 11);
  tensor yl = troupe::matmul(xl, wl);
  troupe::backward(troupe::sum(troupe::mul(yl, yl)));

  tensor x = random_leaf({16, 64}, 5, dev);
  for (int iter = 0; iter < 3; ++iter) {
    da::context ctx(job[0]);
    tensor y = troupe::rpc_sync<tensor>(job.at(0), "worker1", "fwd", x);
    REQUIRE(y.device() == dev);
    job[0].backward(ctx.id(), {troupe::sum(troupe::mul(y, y))});
    const tensor gx = job[0].get_gradients(ctx.id()).at(x);
    const tensor gw = job[1].get_gradients(ctx.id()).at(w);
    CHECK(gx.device() == dev);
    CHECK(gw.device() == dev);
    CHECK(relative_diff(gx, troupe::grad(xl)) < 1e-4);
    CHECK(relative_diff(gw, troupe::grad(wl)) < 1e-4);
  }
  CHECK(job.contexts() == 0);
}
