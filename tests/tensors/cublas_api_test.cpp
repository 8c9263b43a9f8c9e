// Note [cuBLAS on demand]: the entry points the tensor layer uses are looked up by name in the
// toolkit's cuBLAS. Opening the library needs no device. So a wrong name or a missing library
// shows here on every machine that builds the CUDA code, not only on one with a GPU.
#include <string>

#include <catch2/catch.hpp>

#if defined(TROUPE_WITH_CUDA)
#include "cuda/cublas_api.hpp"

TEST_CASE("every cublas entry point the tensor layer uses resolves by name without a device", "[tensors][cublas]") {
  const auto& api = troupe::cuda_detail::cublas();
  CHECK(api.create != nullptr);
  CHECK(api.destroy != nullptr);
  CHECK(api.set_stream != nullptr);
  CHECK(api.sgemm_strided_batched != nullptr);
  CHECK(api.dgemm_strided_batched != nullptr);
  CHECK(api.gemm_strided_batched_ex != nullptr);
  REQUIRE(api.status_name != nullptr);
  CHECK(std::string(api.status_name(CUBLAS_STATUS_SUCCESS)) == "CUBLAS_STATUS_SUCCESS");
  CHECK(&troupe::cuda_detail::cublas() == &api);  // opened once
}
#else
TEST_CASE("every cublas entry point the tensor layer uses resolves by name without a device", "[tensors][cublas]") {
  WARN("built without the CUDA toolkit: cuBLAS is not used");
}
#endif
