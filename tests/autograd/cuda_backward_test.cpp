// Backward of CUDA graphs (Note [Backward streams]): nodes run on the stream their forward used,
// and gradients crossing streams are ordered by events. Skips cleanly without a device.
#include <catch2/catch.hpp>

#include "autograd/autograd_test_util.hpp"
#include "troupe/tensors/cuda.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace troupe;
using troupe::test::leaf;

namespace {
bool no_device() {
  if (cuda::device_count() > 0) return false;
  WARN("no CUDA device: skipped");
  return true;
}

// A CUDA leaf requiring grad holding the values of a CPU leaf.
tensor cuda_leaf(const tensor& cpu_leaf) {
  tensor t = cpu_leaf.detach().to(cuda_device(0));
  set_requires_grad(t);
  return t;
}

// loss = sum(tanh(a @ b) * c), the graph used by every test below.
tensor loss_of(const tensor& a, const tensor& b, const tensor& c) { return sum(mul(tanh(matmul(a, b)), c)); }
}  // namespace

TEST_CASE("backward of a CUDA graph gives the CPU gradients", "[autograd][cuda]") {
  if (no_device()) return;
  const tensor a = leaf({8, 16}, 1), b = leaf({16, 4}, 2), c = leaf({8, 4}, 3);
  backward(loss_of(a, b, c));
  const tensor ga = cuda_leaf(a), gb = cuda_leaf(b), gc = cuda_leaf(c);
  backward(loss_of(ga, gb, gc));
  CHECK(allclose(grad(ga).cpu(), grad(a), 1e-9, 1e-12));
  CHECK(allclose(grad(gb).cpu(), grad(b), 1e-9, 1e-12));
  CHECK(allclose(grad(gc).cpu(), grad(c), 1e-9, 1e-12));
}

#if defined(TROUPE_WITH_CUDA)  // streams exist only in CUDA builds
TEST_CASE("a forward run on a side stream is differentiated on that stream, ordered against the caller's",
          "[autograd][cuda]") {
  if (no_device()) return;
  const tensor a = leaf({64, 64}, 4), b = leaf({64, 64}, 5), c = leaf({64, 64}, 6);
  backward(loss_of(a, b, c));
  const tensor ga = cuda_leaf(a), gb = cuda_leaf(b), gc = cuda_leaf(c);
  cuda::stream side(0);
  tensor part;
  {
    cuda::stream_guard on_side(side);
    part = tanh(matmul(ga, gb));  // recorded with the side stream
  }
  // The rest of the forward and the backward's start run on the default stream: gradients cross
  // from the default stream into the side stream's nodes and back into AccumulateGrad.
  backward(sum(mul(part, gc)));
  cuda::synchronize(0);
  CHECK(allclose(grad(ga).cpu(), grad(a), 1e-9, 1e-12));
  CHECK(allclose(grad(gb).cpu(), grad(b), 1e-9, 1e-12));
  CHECK(allclose(grad(gc).cpu(), grad(c), 1e-9, 1e-12));
}
#endif
