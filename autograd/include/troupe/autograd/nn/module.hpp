#pragma once
/// \file module.hpp
/// The base of every neural-network layer: named parameters, buffers and child modules, kept in
/// registration order. `parameters()` walks a module's own parameters first, then each child in
/// registration order, recursively — DDP assigns gradient buckets from this order (reversed), so
/// it is part of the contract.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/tensors/device.hpp"
#include "troupe/tensors/tensor.hpp"

#include "troupe/tensors/state_dict.hpp"

namespace troupe::nn {

/// A container of named parameters, buffers and child modules (torch.nn.Module without forward;
/// layers with one input derive from `unary_module`, with several from `multi_input_module`).
/// Not copyable: parameters are tensors with identity; optimizers and DDP hold them by handle.
/// So change their values in place (load_state_dict, copy_ under no_grad). Do not assign a new
/// tensor to a layer's public member: the registry would not see it. Not thread-safe.
class module {
 public:
  module() = default;
  virtual ~module() = default;
  module(const module&) = delete;
  module& operator=(const module&) = delete;

  /// All parameters, own first (registration order), then each child's, recursively.
  tensor_list parameters() const;
  /// parameters() with dotted names ("0.weight", "encoder.fc1.bias").
  std::vector<std::pair<std::string, tensor>> named_parameters() const;
  /// All buffers (running statistics and the like), in the same order as parameters().
  std::vector<std::pair<std::string, tensor>> named_buffers() const;
  /// The direct children in registration order.
  const std::vector<std::pair<std::string, std::shared_ptr<module>>>& children() const { return children_; }

  /// Parameters and buffers by dotted name. The tensors share storage with the module's
  /// (detached, like torch's state_dict): copy them before changing the module if needed.
  troupe::state_dict state_dict() const;
  /// Copies `sd` into the parameters and buffers (under no_grad, in place: handles stay valid).
  /// Every present key is checked before anything is copied. Throws shape_mismatch or
  /// dtype_mismatch naming the key and both shapes/dtypes; with `strict`, bad_argument listing
  /// the missing and unexpected keys.
  void load_state_dict(const troupe::state_dict& sd, bool strict = true);

  /// Puts this module and all children in training mode (dropout active).
  void train(bool on = true);
  /// Puts this module and all children in evaluation mode (train(false)).
  void eval() { train(false); }
  bool is_training() const noexcept { return training_; }

  /// Moves every parameter and buffer to `d`, in place: tensor handles keep their identity, so
  /// optimizers built before the move keep working. Gradients are dropped.
  void to(troupe::device d);
  /// Clears the gradient of every parameter (autograd's zero_grad on each).
  void zero_grad();

 protected:
  /// Registers `t` as a parameter named `name` and marks it as requiring grad (when
  /// `requires_grad`). Throws bad_argument for an empty, dotted or duplicate name, or an
  /// undefined tensor. Returns the same handle.
  tensor& register_parameter(const std::string& name, tensor& t, bool requires_grad = true);
  /// Registers a buffer: state saved in state_dict() but not trained.
  tensor& register_buffer(const std::string& name, tensor& t);
  /// Registers a child module; its parameters follow this module's own.
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> child) {
    check_new_name(name, child != nullptr);
    children_.emplace_back(name, child);
    return child;
  }

 private:
  void check_new_name(const std::string& name, bool defined) const;
  void collect(const std::string& prefix, bool params, std::vector<std::pair<std::string, tensor>>& out) const;

  std::vector<std::pair<std::string, tensor>> params_;
  std::vector<std::pair<std::string, tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<module>>> children_;
  bool training_ = true;
};

/// A module with one tensor input and one tensor output (everything `sequential` can chain).
class unary_module : public module {
 public:
  /// Runs the layer; records autograd when grad mode is on and an input or parameter requires it.
  virtual tensor forward(const tensor& input) = 0;
  /// forward(input).
  tensor operator()(const tensor& input) { return forward(input); }
};

/// A module with several tensor inputs and one tensor output (a torch module whose forward takes
/// several tensors: a two-tower model, features plus a mask).
class multi_input_module : public module {
 public:
  /// Runs the layer on `inputs` (their number and meaning are the module's contract; throw
  /// bad_argument for a wrong count); records autograd as unary_module::forward does.
  virtual tensor forward(const tensor_list& inputs) = 0;
  /// forward(inputs).
  tensor operator()(const tensor_list& inputs) { return forward(inputs); }
};

}  // namespace troupe::nn
