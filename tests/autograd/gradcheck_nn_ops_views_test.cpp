// Finite-difference checks of every differentiable op of nn_ops.hpp and every view and copy of
// tensor.hpp (including views of non-contiguous tensors).
#include <catch2/catch.hpp>

#include "autograd/autograd_test_util.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/nn_ops.hpp"

using namespace troupe;
using troupe::test::as_leaf;
using troupe::test::check_all;
using troupe::test::grad_case;
using troupe::test::leaf;

namespace {

tensor idx(std::vector<std::int64_t> v, shape_t s) { return from_vector<std::int64_t>(v, std::move(s)); }
}  // namespace

TEST_CASE("softmax and indexing ops have correct gradients", "[autograd][gradcheck]") {
  const tensor a = leaf({3, 4}, 71, -2.0, 2.0), at = as_leaf(leaf({4, 3}, 72, -2.0, 2.0).t());
  const tensor rows = idx({2, 0, 2, 1}, {4});  // repeated index: gradients must accumulate
  const tensor gi = idx({0, 3, 3, 1, 2, 0}, {3, 2});
  const tensor src32 = leaf({3, 2}, 73), src42 = leaf({4, 2}, 74), src34 = leaf({4, 4}, 75);
  check_all({
      {"softmax last", [](const tensor_list& v) { return softmax(v[0], -1); }, {a}},
      {"softmax dim 0", [](const tensor_list& v) { return softmax(v[0], 0); }, {at}},
      {"log_softmax", [](const tensor_list& v) { return log_softmax(v[0], 1); }, {a}},
      {"log_softmax dim 0 non-contiguous", [](const tensor_list& v) { return log_softmax(v[0], 0); }, {at}},
      {"index_select rows", [rows](const tensor_list& v) { return index_select(v[0], 0, rows); }, {leaf({3, 2}, 76)}},
      {"index_select cols", [rows](const tensor_list& v) { return index_select(v[0], 1, rows.slice(0, 0, 3)); }, {a}},
      {"gather", [gi](const tensor_list& v) { return gather(v[0], 1, gi); }, {a}},
      {"scatter_add", [gi](const tensor_list& v) { return scatter_add(v[0], 1, gi, v[1]); }, {a, src32}},
      {"index_add", [rows](const tensor_list& v) { return index_add(v[0], 0, rows, v[1]); }, {leaf({3, 2}, 77), src42}},
      {"index_add dim 1", [rows](const tensor_list& v) { return index_add(v[0], 1, rows, v[1]); }, {a, src34.slice(0, 0, 3)}},
      {"cat", [](const tensor_list& v) { return cat({v[0], v[1], v[0]}, 0); }, {a, leaf({2, 4}, 78)}},
      {"cat dim 1", [](const tensor_list& v) { return cat({v[0], v[1]}, 1); }, {at, leaf({3, 1}, 79)}},
      {"stack", [](const tensor_list& v) { return stack({v[0], v[1]}, 1); }, {a, at}},
  });
}

TEST_CASE("every view has correct gradients, also of non-contiguous tensors", "[autograd][gradcheck]") {
  const tensor a = leaf({2, 3, 4}, 81), at = as_leaf(leaf({4, 3, 2}, 82).permute({2, 1, 0}));
  check_all({
      {"view", [](const tensor_list& v) { return v[0].view({6, 4}) * 2.0; }, {a}},
      {"view -1", [](const tensor_list& v) { return v[0].view({-1}); }, {a}},
      {"reshape copying", [](const tensor_list& v) { return v[0].reshape({4, 6}); }, {at}},
      {"transpose", [](const tensor_list& v) { return v[0].transpose(0, 2); }, {a}},
      {"t", [](const tensor_list& v) { return v[0].select(0, 1).t(); }, {at}},
      {"permute", [](const tensor_list& v) { return v[0].permute({1, 2, 0}); }, {at}},
      {"narrow", [](const tensor_list& v) { return v[0].narrow(2, 1, 2); }, {a}},
      {"slice step", [](const tensor_list& v) { return v[0].slice(2, 0, 4, 2); }, {at}},
      {"slice negative", [](const tensor_list& v) { return v[0].slice(1, -2, 3); }, {a}},
      {"select", [](const tensor_list& v) { return v[0].select(1, 2); }, {a}},
      {"select negative", [](const tensor_list& v) { return v[0].select(-1, -1); }, {at}},
      {"expand", [](const tensor_list& v) { return v[0].expand({3, 2, 4}) * v[1]; }, {leaf({2, 1}, 83), leaf({3, 2, 4}, 84)}},
      {"expand leading", [](const tensor_list& v) { return v[0].expand({2, 3, 4}); }, {leaf({4}, 85)}},
      {"squeeze", [](const tensor_list& v) { return v[0].squeeze(); }, {leaf({2, 1, 3, 1}, 86)}},
      {"squeeze dim", [](const tensor_list& v) { return v[0].squeeze(1); }, {leaf({2, 1, 3}, 87)}},
      {"unsqueeze", [](const tensor_list& v) { return v[0].unsqueeze(1).unsqueeze(-1); }, {at}},
      {"flatten", [](const tensor_list& v) { return v[0].flatten(1); }, {a}},
      {"flatten non-contiguous", [](const tensor_list& v) { return v[0].flatten(); }, {at}},
      {"contiguous", [](const tensor_list& v) { return v[0].contiguous() * v[0]; }, {at}},
      {"clone", [](const tensor_list& v) { return v[0].clone() * v[0]; }, {a}},
      {"views chained", [](const tensor_list& v) { return v[0].transpose(0, 1).reshape({3, 8}).slice(1, 1, 7, 3); }, {at}},
      // Through float32: differences of 1e-6 vanish in float32 rounding, so a coarser step.
      {"to float32 and back", [](const tensor_list& v) { return v[0].to(dtype::float32).to(dtype::float64); }, {a},
       1e-2, 1e-4, 1e-3},
  });
}
