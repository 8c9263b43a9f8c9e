// The send function puts arriving gradients on the sent tensors' devices
// (Note [Gradients keep their device] in functions.hpp).
#include <catch2/catch.hpp>

#include "troupe/dist_autograd/functions.hpp"
#include "troupe/tensors/cuda.hpp"
#include "troupe/tensors/factories.hpp"

using namespace troupe;

TEST_CASE("a send function passes a gradient through untouched when it arrives on the sent tensor's device",
          "[dist_autograd]") {
  dist_autograd::send_function send(edge_list{edge{}, edge{}}, {cpu_device, cpu_device});
  const tensor g = full({3}, 2.0);
  tensor_list out = send.apply({g, tensor()});
  REQUIRE(out.size() == 2);
  CHECK(out[0].data_ptr() == g.data_ptr());
  CHECK_FALSE(out[1].defined());
  CHECK(send.devices() == std::vector<device>{cpu_device, cpu_device});
}

TEST_CASE("a gradient staged to the host on its way back reaches the sent tensor's CUDA device with its values",
          "[dist_autograd][cuda]") {
  if (cuda::device_count() == 0) {
    WARN("no CUDA device: skipped");
    return;
  }
  const device dev = cuda_device(0);
  dist_autograd::send_function send(edge_list{edge{}}, {dev});
  const tensor g = arange(0, 6, 1, {dtype::float32}).reshape({2, 3});
  tensor_list out = send.apply({g});
  REQUIRE(out.size() == 1);
  CHECK(out[0].device() == dev);
  CHECK(out[0].shape() == g.shape());
  const tensor back = out[0].cpu();
  for (std::int64_t i = 0; i < 6; ++i) CHECK(back.data<float>()[i] == static_cast<float>(i));
}
