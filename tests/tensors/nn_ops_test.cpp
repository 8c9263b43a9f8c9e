// softmax family, indexing and joining ops against plain-loop references.
#include <catch2/catch.hpp>

#include <cmath>

#include "tensor_test_util.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/nn_ops.hpp"

using namespace troupe;
using namespace troupe::test;

TEST_CASE("softmax and log_softmax match a stable float64 reference", "[tensors][nn_ops]") {
  const auto l = GENERATE(layout::contiguous, layout::transposed, layout::strided);
  const auto t = GENERATE(dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16);
  const std::int64_t dim = GENERATE(0, 1, -1);
  const tensor a = mul(make_input({3, 4, 5}, t, l, 1), 40.0);  // large logits: needs the max shift
  INFO(to_string(t) << " " << to_string(l) << " dim " << dim);
  const std::size_t d = static_cast<std::size_t>(dim < 0 ? dim + 3 : dim);
  auto ref = [&](const shape_t& i, bool log) {
    double mx = -INFINITY, s = 0;
    shape_t j = i;
    for (j[d] = 0; j[d] < a.shape()[d]; ++j[d]) mx = std::max(mx, read_at(a, j));
    for (j[d] = 0; j[d] < a.shape()[d]; ++j[d]) s += std::exp(read_at(a, j) - mx);
    return log ? read_at(a, i) - mx - std::log(s) : std::exp(read_at(a, i) - mx) / s;
  };
  const tensor y = softmax(a, dim);
  CHECK(y.dtype() == t);
  check_all(y, [&](const shape_t& i) { return round_to(ref(i, false), t); }, 4.0);
  check_all(log_softmax(a, dim), [&](const shape_t& i) { return round_to(ref(i, true), t); }, 4.0);
}

TEST_CASE("softmax rejects integer inputs and bad dims", "[tensors][nn_ops]") {
  CHECK_THROWS_AS(softmax(from_vector<std::int64_t>({1, 2}), 0), troupe::error);
  CHECK_THROWS_AS(softmax(zeros({2, 3}), 2), troupe::error);
}

TEST_CASE("index_select picks slices along any dim", "[tensors][nn_ops]") {
  const auto l = GENERATE(layout::contiguous, layout::transposed, layout::strided);
  const tensor a = make_input({4, 3}, dtype::float32, l, 1);
  const tensor idx = from_vector<std::int64_t>({3, 0, 3});
  const tensor r0 = index_select(a, 0, idx);
  CHECK(r0.shape() == shape_t{3, 3});
  check_all(r0, [&](const shape_t& i) { return read_at(a, {read_at(idx, {i[0]}) == 3 ? 3 : 0, i[1]}); });
  const tensor r1 = index_select(a, 1, from_vector<std::int32_t>({2, 1}));
  check_all(r1, [&](const shape_t& i) { return read_at(a, {i[0], 2 - i[1]}); });
  try {
    index_select(a, 0, from_vector<std::int64_t>({4}));
    FAIL("expected index_out_of_range");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::index_out_of_range);
    CHECK_THAT(std::string(e.what()), Catch::Contains("index_select") && Catch::Contains("4"));
  }
  CHECK_THROWS_AS(index_select(a, 0, from_vector<float>({0.f})), troupe::error);
  CHECK_THROWS_AS(index_select(a, 0, from_vector<std::int64_t>({-1})), troupe::error);
}

TEST_CASE("gather and scatter_add follow torch semantics", "[tensors][nn_ops]") {
  const tensor a = from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  const tensor idx = from_vector<std::int64_t>({2, 0, 1, 1}, {2, 2});
  const tensor g = gather(a, 1, idx);
  CHECK(values(g) == std::vector<double>{3, 1, 5, 5});
  const tensor s = scatter_add(zeros({2, 3}, dtype::float64), 1, idx, ones({2, 2}, dtype::float64));
  CHECK(values(s) == std::vector<double>{1, 0, 1, 0, 2, 0});
  const tensor g0 = gather(a, 0, from_vector<std::int64_t>({1, 0, 1}, {1, 3}));
  CHECK(values(g0) == std::vector<double>{4, 2, 6});
  CHECK(values(a) == std::vector<double>{1, 2, 3, 4, 5, 6});  // inputs untouched
  CHECK_THROWS_AS(gather(a, 1, from_vector<std::int64_t>({3}, {1, 1})), troupe::error);
  CHECK_THROWS_AS(gather(a, 1, from_vector<std::int64_t>({0}, {1})), troupe::error);
  CHECK_THROWS_AS(scatter_add(a, 1, idx, ones({2, 2})), troupe::error);  // dtype differs
}

TEST_CASE("index_add accumulates repeated indices", "[tensors][nn_ops]") {
  const tensor base = zeros({3, 2}, dtype::float32);
  const tensor src = from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  const tensor r = index_add(base, 0, from_vector<std::int64_t>({2, 0, 2}), src);
  CHECK(values(r) == std::vector<double>{3, 4, 0, 0, 6, 8});
  CHECK(values(base) == std::vector<double>(6, 0.0));
  CHECK_THROWS_AS(index_add(base, 0, from_vector<std::int64_t>({0}), src), troupe::error);
}

TEST_CASE("cat and stack join along a dim with promotion and validation", "[tensors][nn_ops]") {
  const tensor a = make_input({2, 3}, dtype::float32, layout::transposed, 1);
  const tensor b = make_input({1, 3}, dtype::float64, layout::contiguous, 2);
  const tensor c = cat({a, b}, 0);
  CHECK(c.shape() == shape_t{3, 3});
  CHECK(c.dtype() == dtype::float64);
  check_all(c, [&](const shape_t& i) { return i[0] < 2 ? read_at(a, i) : read_at(b, {0, i[1]}); });
  const tensor c1 = cat({a, a}, -1);
  CHECK(c1.shape() == shape_t{2, 6});
  check_all(c1, [&](const shape_t& i) { return read_at(a, {i[0], i[1] % 3}); });
  CHECK(cat({zeros({0, 3}), a}, 0).shape() == shape_t{2, 3});
  const tensor s = stack({a, a, a}, 1);
  CHECK(s.shape() == shape_t{2, 3, 3});
  check_all(s, [&](const shape_t& i) { return read_at(a, {i[0], i[2]}); });
  CHECK(stack({a, a}, -1).shape() == shape_t{2, 3, 2});
  CHECK_THROWS_AS(cat({a, zeros({2, 4})}, 0), troupe::error);
  CHECK_THROWS_AS(cat({}, 0), troupe::error);
  CHECK_THROWS_AS(stack({a, b}, 0), troupe::error);
}
