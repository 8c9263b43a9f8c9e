#pragma once
/// \file state_dict.hpp
/// A state dict: named tensors, ordered by name (a module's parameters and buffers, an
/// optimizer's state), as saved to and loaded from checkpoint files.

#include <map>
#include <string>

#include "troupe/tensors/tensor.hpp"

namespace troupe {

/// Named tensors ordered by name.
using state_dict = std::map<std::string, tensor>;

}  // namespace troupe
