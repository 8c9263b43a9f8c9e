#pragma once
// Private: how view and conversion methods of tensor record autograd (Note [Op recording]).

#include <functional>

#include "troupe/tensors/tensor.hpp"

namespace troupe::detail {

/// Records a one-input op whose backward maps the output gradient back to the input. It records
/// nothing when should_record({&in}) is false. An undefined output gradient gives an undefined
/// input gradient.
void record_view(const char* name, const tensor& in, const tensor& out, std::function<tensor(const tensor&)> grad_fn);

}  // namespace troupe::detail
