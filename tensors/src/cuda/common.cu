// Launch sizing and scratch buffers shared by the CUDA kernel files.
#include <unordered_map>

#include "common.cuh"
#include "troupe/tensors/factories.hpp"

namespace troupe::cuda_detail {

int grid_for(std::int64_t n, int device, int threads) {
  thread_local std::unordered_map<int, int> sm_counts;
  auto it = sm_counts.find(device);
  if (it == sm_counts.end()) {
    int sms = 0;
    TROUPE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    it = sm_counts.emplace(device, sms > 0 ? sms : 1).first;
  }
  const std::int64_t needed = (n + threads - 1) / threads;
  const std::int64_t cap = static_cast<std::int64_t>(it->second) * (2048 / threads) * 4;  // a few full waves
  return static_cast<int>(std::max<std::int64_t>(1, std::min(needed, cap)));
}

tensor scratch(const shape_t& shape, dtype t, const tensor& like) {
  return empty(shape, tensor_options(t, like.device()));
}

}  // namespace troupe::cuda_detail
