#pragma once
/// \file saved_variable.hpp
/// A tensor saved by an op for its backward. It is a detached alias: it shares storage and the
/// version counter, and has no history. It keeps the version at save time, checked when the
/// backward reads it.

#include <cstdint>
#include <string>

#include "troupe/tensors/tensor.hpp"

namespace troupe {

/// A tensor saved for backward. Holding the detached alias (not the original tensor) keeps a
/// node from owning its own output's metadata, which would be a reference cycle.
class saved_variable {
 public:
  saved_variable() = default;
  /// Saves `t` (may be undefined) at its current version.
  explicit saved_variable(const tensor& t);

  /// The saved tensor. Throws troupe::error(autograd_error) "saved tensor of <op> was modified
  /// in place (version X, expected Y)" if its storage was written since it was saved.
  tensor unpack(const std::string& op) const;
  /// Drops the data (retain_graph = false frees saved tensors after use).
  void reset() noexcept { data_ = tensor(); }

 private:
  tensor data_;
  std::uint64_t version_ = 0;
};

}  // namespace troupe
