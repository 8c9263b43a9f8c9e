// Note [cuBLAS on demand]: cuBLAS is opened on a process's first GPU matrix product. The test
// uses fresh processes, exec'd, so nothing is loaded before. One that multiplies only on the
// CPU never maps it. One that multiplies on a GPU maps it then and gets the right product.
#include <chrono>
#include <fstream>
#include <string>

#include <catch2/catch.hpp>

#include "integration/exec_child.hpp"
#include "troupe/tensors/cuda.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/linalg.hpp"

using namespace std::chrono_literals;
using namespace troupe;

namespace {

bool maps_cublas() {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find("libcublas") != std::string::npos) return true;
  return false;
}

// [2,3] x [3,2] with a known product.
tensor lhs() { return arange(6.0, {dtype::float32}).reshape({2, 3}); }
tensor rhs() { return arange(6.0, {dtype::float32}).reshape({3, 2}); }
tensor product() {
  auto p = empty({2, 2}, {dtype::float32});
  const float want[] = {10, 13, 28, 40};
  for (int i = 0; i < 4; ++i) static_cast<float*>(p.data_ptr())[i] = want[i];
  return p;
}

}  // namespace

TEST_CASE("a process that multiplies only on the cpu never loads cublas", "[integration][tensors]") {
  auto kid = test::exec_children(1, "child: multiplies on the cpu and looks for cublas");
  CHECK(kid.join(60s));
}

TEST_CASE("child: multiplies on the cpu and looks for cublas", "[.]") {
  if (test::child_rank() == 0) return;
  CHECK(allclose(matmul(lhs(), rhs()), product()));
  CHECK_FALSE(maps_cublas());
}

TEST_CASE("a process loads cublas on its first gpu matrix product and gets the product", "[integration][tensors][cuda]") {
  auto kid = test::exec_children(1, "child: multiplies on the gpu and looks for cublas");
  CHECK(kid.join(60s));
}

TEST_CASE("child: multiplies on the gpu and looks for cublas", "[.]") {
  if (test::child_rank() == 0) return;
  if (cuda::device_count() == 0) {
    WARN("no CUDA device: skipped");
    return;
  }
  CHECK_FALSE(maps_cublas());
  const tensor got = matmul(lhs().to(cuda_device(0)), rhs().to(cuda_device(0)));
  CHECK(maps_cublas());
  CHECK(allclose(got.cpu(), product()));
}
