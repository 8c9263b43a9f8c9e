#pragma once
/// \file sequential.hpp
/// A chain of unary modules applied in order (torch.nn.Sequential).

#include <memory>
#include <utility>

#include "troupe/autograd/nn/module.hpp"

namespace troupe::nn {

/// Applies its children in the order they were pushed. Children are named "0", "1", ... so
/// their parameters are "0.weight", "0.bias", ... as in PyTorch.
class sequential : public unary_module {
 public:
  sequential() = default;
  /// Builds from a list of modules (each a shared_ptr to a unary_module subclass).
  template <class... M>
  explicit sequential(std::shared_ptr<M>... modules) {
    (push_back(std::move(modules)), ...);
  }

  /// Appends a module; returns it (typed) for convenience.
  template <class M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    layers_.push_back(m);
    return register_module(std::to_string(layers_.size() - 1), std::move(m));
  }

  /// Runs every layer in order; an empty sequential is the identity.
  tensor forward(const tensor& input) override;

  std::size_t size() const noexcept { return layers_.size(); }
  /// The i-th layer; index_out_of_range when i >= size().
  unary_module& operator[](std::size_t i) const;

 private:
  std::vector<std::shared_ptr<unary_module>> layers_;
};

}  // namespace troupe::nn
