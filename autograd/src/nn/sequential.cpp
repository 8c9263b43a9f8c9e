// Sequential and the activation layers.
#include "troupe/autograd/nn/sequential.hpp"

#include "troupe/autograd/nn/activation.hpp"
#include "troupe/tensors/elementwise.hpp"

namespace troupe::nn {

tensor sequential::forward(const tensor& input) {
  tensor x = input;
  for (auto& layer : layers_) x = layer->forward(x);
  return x;
}

unary_module& sequential::operator[](std::size_t i) const {
  if (i >= layers_.size())
    throw error(errc::index_out_of_range, "sequential: index " + std::to_string(i) + " out of range for " +
                                              std::to_string(layers_.size()) + " layers");
  return *layers_[i];
}

tensor relu::forward(const tensor& input) { return troupe::relu(input); }
tensor tanh::forward(const tensor& input) { return troupe::tanh(input); }
tensor sigmoid::forward(const tensor& input) { return troupe::sigmoid(input); }
tensor gelu::forward(const tensor& input) { return troupe::gelu(input); }

}  // namespace troupe::nn
