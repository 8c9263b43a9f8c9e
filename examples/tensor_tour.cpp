// A short tour of the tensor library: factories, views, broadcasting ops, reductions,
// matmul and seeded random draws. Run: build/examples/tensor_tour (`make build` builds it).
#include <cstdio>
#include <cstring>

#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/nn_ops.hpp"
#include "troupe/tensors/reduction.hpp"

int main(int argc, char** argv) {
  using namespace troupe;
  if (argc > 1) {
    const bool help = std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0;
    if (!help) std::fprintf(stderr, "tensor_tour: unknown option %s\n", argv[1]);
    std::fputs("usage: tensor_tour\nPrints a short tour of the tensor library. Takes no options but --help.\n",
               help ? stdout : stderr);
    return help ? 0 : 2;
  }
  const tensor a = arange(6, dtype::float32).reshape({2, 3});
  std::printf("a = %s\n", a.to_string().c_str());
  std::printf("a.t() (a view) = %s\n", a.t().to_string().c_str());
  const tensor b = from_vector<float>({10, 20, 30});
  std::printf("a + b (broadcast) = %s\n", (a + b).to_string().c_str());
  std::printf("sum(a, {1}) = %s\n", sum(a, {1}).to_string().c_str());
  std::printf("a @ a.t() = %s\n", matmul(a, a.t()).to_string().c_str());
  std::printf("softmax(a, 1) = %s\n", softmax(a, 1).to_string().c_str());
  generator gen(2024);
  std::printf("randn({2, 2}) seed 2024 = %s\n", randn({2, 2}, gen).to_string().c_str());
  std::printf("a.to(float16) = %s\n", a.to(dtype::float16).to_string().c_str());
  return 0;
}
