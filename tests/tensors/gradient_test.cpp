// Every differentiable op's backward formula against central finite differences.
// The autograd layer is replaced by a metadata object that captures the op_record. So the
// formulas are checked on their own (Note [Op recording]). L = sum(op(inputs) * g) with a fixed
// random g. dL/dx from the recorded backward is compared with
// (L(x + h e_j) - L(x - h e_j)) / 2h in float64.
#include <catch2/catch.hpp>

#include <functional>
#include <memory>

#include "tensor_test_util.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/linalg.hpp"
#include "troupe/tensors/nn_ops.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {
class capture_meta final : public autograd_meta_interface {
 public:
  explicit capture_meta(std::shared_ptr<std::vector<op_record>> log) : log_(std::move(log)) {}
  bool requires_grad() const override { return true; }
  void record(op_record&& rec) const override { log_->push_back(std::move(rec)); }

 private:
  std::shared_ptr<std::vector<op_record>> log_;
};

// The records hold the tracked inputs, whose metadata holds the log: clear it on every exit
// to break that cycle.
struct clear_on_exit {
  std::shared_ptr<std::vector<op_record>> log;
  ~clear_on_exit() { log->clear(); }
};

using op_fn = std::function<tensor(const tensor_list&)>;

double loss(const op_fn& f, const tensor_list& in, const tensor& g) {
  const tensor out = f(in);
  double s = 0;
  const auto o = values(out), w = values(g);
  for (std::size_t i = 0; i < o.size(); ++i) s += o[i] * w[i];
  return s;
}

// Checks the gradients of every floating input of f at `inputs` (float64, contiguous).
void check_gradients(const std::string& name, const op_fn& f, const tensor_list& inputs) {
  INFO(name);
  auto log = std::make_shared<std::vector<op_record>>();
  const clear_on_exit guard{log};
  tensor_list tracked;
  for (const auto& x : inputs) {
    tensor t = x.detach();
    if (is_floating(t.dtype())) t.set_autograd_meta(std::make_shared<capture_meta>(log));
    tracked.push_back(t);
  }
  const tensor out = f(tracked);
  REQUIRE_FALSE(log->empty());
  const op_record& rec = log->back();
  REQUIRE(rec.outputs[0].is_same(out));
  generator gen(11);
  const tensor g = randn(out.shape(), gen, dtype::float64);
  const tensor_list grad_outputs{g};
  std::vector<bool> needs;
  for (const auto& x : rec.inputs) needs.push_back(x.defined() && is_floating(x.dtype()));
  tensor_list grads;
  {
    no_grad_guard ng;
    grads = rec.backward(backward_ctx{rec.saved, grad_outputs, needs});
  }
  REQUIRE(grads.size() == rec.inputs.size());
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (!is_floating(inputs[k].dtype())) continue;
    // the recorded input k is the tracked tensor k (ops record their tensor inputs in order)
    std::size_t r = 0;
    while (r < rec.inputs.size() && !rec.inputs[r].is_same(tracked[k])) ++r;
    if (r == rec.inputs.size()) continue;
    INFO("input " << k);
    REQUIRE(grads[r].defined());
    CHECK(grads[r].shape() == inputs[k].shape());
    CHECK(grads[r].dtype() == inputs[k].dtype());
    const auto analytic = values(grads[r]);
    for (std::int64_t j = 0; j < inputs[k].numel(); ++j) {
      const double h = 1e-6;
      tensor_list plus = inputs, minus = inputs;
      plus[k] = inputs[k].clone();
      minus[k] = inputs[k].clone();
      static_cast<double*>(plus[k].data_ptr())[j] += h;
      static_cast<double*>(minus[k].data_ptr())[j] -= h;
      const double numeric = (loss(f, plus, g) - loss(f, minus, g)) / (2 * h);
      INFO("element " << j);
      CHECK(analytic[static_cast<std::size_t>(j)] == Approx(numeric).margin(1e-5).epsilon(1e-5));
    }
  }
}

tensor in(const shape_t& s, std::int64_t seed, bool positive = false) {
  // distinct values (no ties, away from kinks) so finite differences are valid
  generator gen(static_cast<std::uint64_t>(seed));
  tensor x = rand(s, gen, dtype::float64, 0.5, 1.5);
  return positive ? x : sub(x, mul(rand(s, gen, dtype::float64), 2.5));
}
}  // namespace

TEST_CASE("binary op gradients match finite differences, broadcasting included", "[tensors][grad]") {
  check_gradients("add", [](const tensor_list& x) { return add(x[0], x[1], 0.5); }, {in({2, 3}, 1), in({3}, 2)});
  check_gradients("sub", [](const tensor_list& x) { return sub(x[0], x[1], 2.0); }, {in({2, 1}, 1), in({2, 3}, 2)});
  check_gradients("mul", [](const tensor_list& x) { return mul(x[0], x[1]); }, {in({2, 3}, 1), in({1, 3}, 2)});
  check_gradients("div", [](const tensor_list& x) { return div(x[0], x[1]); }, {in({2, 3}, 1), in({3}, 2, true)});
  check_gradients("pow", [](const tensor_list& x) { return pow(x[0], x[1]); }, {in({2, 3}, 1, true), in({2, 3}, 2)});
  check_gradients("maximum", [](const tensor_list& x) { return maximum(x[0], x[1]); }, {in({2, 3}, 1), in({2, 3}, 2)});
  check_gradients("minimum", [](const tensor_list& x) { return minimum(x[0], x[1]); }, {in({2, 3}, 1), in({3}, 2)});
  check_gradients("where", [](const tensor_list& x) { return where(gt(x[0], 0.0), x[0], x[1]); }, {in({2, 3}, 1), in({3}, 2)});
}

TEST_CASE("scalar op gradients match finite differences", "[tensors][grad]") {
  const tensor x = in({2, 3}, 3, true);
  check_gradients("add_s", [](const tensor_list& v) { return add(v[0], 2.0); }, {x});
  check_gradients("mul_s", [](const tensor_list& v) { return mul(v[0], -3.0); }, {x});
  check_gradients("div_s", [](const tensor_list& v) { return div(v[0], 4.0); }, {x});
  check_gradients("pow_s", [](const tensor_list& v) { return pow(v[0], 2.5); }, {x});
  check_gradients("rsub", [](const tensor_list& v) { return rsub(v[0], 1.0); }, {x});
  check_gradients("rdiv", [](const tensor_list& v) { return rdiv(v[0], 2.0); }, {x});
}

TEST_CASE("unary op gradients match finite differences", "[tensors][grad]") {
  const tensor x = in({3, 4}, 4), p = in({3, 4}, 5, true);
  check_gradients("neg", [](const tensor_list& v) { return neg(v[0]); }, {x});
  check_gradients("abs", [](const tensor_list& v) { return abs(v[0]); }, {x});
  check_gradients("exp", [](const tensor_list& v) { return exp(v[0]); }, {x});
  check_gradients("log", [](const tensor_list& v) { return log(v[0]); }, {p});
  check_gradients("sqrt", [](const tensor_list& v) { return sqrt(v[0]); }, {p});
  check_gradients("rsqrt", [](const tensor_list& v) { return rsqrt(v[0]); }, {p});
  check_gradients("relu", [](const tensor_list& v) { return relu(v[0]); }, {x});
  check_gradients("sigmoid", [](const tensor_list& v) { return sigmoid(v[0]); }, {x});
  check_gradients("tanh", [](const tensor_list& v) { return tanh(v[0]); }, {x});
  check_gradients("gelu", [](const tensor_list& v) { return gelu(v[0]); }, {x});
}

TEST_CASE("reduction gradients match finite differences", "[tensors][grad]") {
  const tensor x = in({2, 3, 4}, 6);
  check_gradients("sum", [](const tensor_list& v) { return sum(v[0], {0, 2}); }, {x});
  check_gradients("sum_all", [](const tensor_list& v) { return sum(v[0]); }, {x});
  check_gradients("mean", [](const tensor_list& v) { return mean(v[0], {1}, true); }, {x});
  check_gradients("amax", [](const tensor_list& v) { return amax(v[0], {0, 2}); }, {x});
  check_gradients("amin", [](const tensor_list& v) { return amin(v[0], {1}, true); }, {x});
  check_gradients("var", [](const tensor_list& v) { return var(v[0], {2}); }, {x});
  check_gradients("var_all", [](const tensor_list& v) { return var(v[0], {}, false); }, {x});
}

TEST_CASE("amax sends the whole gradient to the first maximal element", "[tensors][grad]") {
  auto log = std::make_shared<std::vector<op_record>>();
  const clear_on_exit guard{log};
  tensor x = from_vector<double>({3, 1, 3, 2}, {2, 2});
  x.set_autograd_meta(std::make_shared<capture_meta>(log));
  amax(x);
  const op_record& rec = log->back();
  const tensor_list go{scalar_tensor(1.0, dtype::float64)};
  const std::vector<bool> needs{true};
  no_grad_guard ng;
  const auto grads = rec.backward(backward_ctx{rec.saved, go, needs});
  CHECK(values(grads[0]) == std::vector<double>{1, 0, 0, 0});
}

TEST_CASE("matrix product gradients match finite differences", "[tensors][grad]") {
  check_gradients("mm", [](const tensor_list& v) { return matmul(v[0], v[1]); }, {in({2, 3}, 1), in({3, 4}, 2)});
  check_gradients("mm_bcast", [](const tensor_list& v) { return matmul(v[0], v[1]); }, {in({2, 2, 3}, 1), in({3, 2}, 2)});
  check_gradients("mv", [](const tensor_list& v) { return matmul(v[0], v[1]); }, {in({2, 3}, 1), in({3}, 2)});
  check_gradients("vm", [](const tensor_list& v) { return matmul(v[0], v[1]); }, {in({3}, 1), in({2, 3, 2}, 2)});
  check_gradients("dot", [](const tensor_list& v) { return matmul(v[0], v[1]); }, {in({3}, 1), in({3}, 2)});
  check_gradients("addmm", [](const tensor_list& v) { return addmm(v[0], v[1], v[2], 0.5, 2.0); },
                  {in({3}, 0), in({2, 4}, 1), in({4, 3}, 2)});
}

TEST_CASE("softmax and indexing gradients match finite differences", "[tensors][grad]") {
  const tensor x = in({3, 4}, 7);
  check_gradients("softmax", [](const tensor_list& v) { return softmax(v[0], 1); }, {x});
  check_gradients("softmax0", [](const tensor_list& v) { return softmax(v[0], 0); }, {x});
  check_gradients("log_softmax", [](const tensor_list& v) { return log_softmax(v[0], -1); }, {x});
  const tensor idx = from_vector<std::int64_t>({2, 0, 2});
  check_gradients("index_select", [idx](const tensor_list& v) { return index_select(v[0], 0, idx); }, {x});
  const tensor gi = from_vector<std::int64_t>({3, 0, 0, 1, 2, 2}, {3, 2});
  check_gradients("gather", [gi](const tensor_list& v) { return gather(v[0], 1, gi); }, {x});
  check_gradients("scatter_add", [gi](const tensor_list& v) { return scatter_add(v[0], 1, gi, v[1]); }, {x, in({3, 3}, 8)});
  check_gradients("index_add", [idx](const tensor_list& v) { return index_add(v[0], 0, idx, v[1]); }, {x, in({3, 4}, 9)});
  check_gradients("cat", [](const tensor_list& v) { return cat({v[0], v[1]}, 1); }, {x, in({3, 2}, 10)});
}
