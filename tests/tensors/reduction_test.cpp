// Reductions against float64 references over shapes, dim sets, keepdim, layouts and dtypes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include "tensor_test_util.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {
struct rcase {
  shape_t shape, dims;
};

// Reference: folds the input elements that map to output index `out` (keepdim form).
std::vector<double> slice_values(const tensor& a, const shape_t& dims, const shape_t& out) {
  std::vector<double> v;
  for_each_idx(a.shape(), [&](const shape_t& i) {
    for (std::size_t d = 0; d < i.size(); ++d) {
      const bool red = dims.empty() || std::find(dims.begin(), dims.end(), static_cast<std::int64_t>(d)) != dims.end();
      if (!red && i[d] != out[d]) return;
    }
    v.push_back(read_at(a, i));
  });
  if (a.dim() == 0) v = {read_at(a, {})};
  return v;
}
}  // namespace

TEST_CASE("sum mean amax amin and var match a float64 reference", "[tensors][reduction]") {
  const auto c = GENERATE(values<rcase>({{{3, 4}, {1}},
                                         {{3, 4}, {0}},
                                         {{2, 3, 4}, {0, 2}},
                                         {{2, 3, 4}, {}},
                                         {{5}, {0}},
                                         {{4, 3}, {-1}},
                                         {{2, 1000}, {1}},
                                         {{0, 3}, {1}}}));
  const auto l = GENERATE(layout::contiguous, layout::transposed, layout::strided, layout::expanded);
  const auto t = GENERATE(dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16);
  const bool keepdim = GENERATE(false, true);
  const tensor a = make_input(c.shape, t, l, 4);
  shape_t dims;
  for (auto d : c.dims) dims.push_back(d < 0 ? d + static_cast<std::int64_t>(c.shape.size()) : d);
  INFO(shape_to_string(c.shape) << " dims " << shape_to_string(c.dims) << " " << to_string(t) << " " << to_string(l)
                                << " keepdim " << keepdim);
  // maps an output index (keepdim or not) to the keepdim form
  auto keep_idx = [&](const shape_t& i) {
    if (keepdim) return i;
    shape_t k;
    std::size_t j = 0;
    for (std::size_t d = 0; d < c.shape.size(); ++d) {
      const bool red = dims.empty() || std::find(dims.begin(), dims.end(), static_cast<std::int64_t>(d)) != dims.end();
      k.push_back(red ? 0 : i[j++]);
    }
    return k;
  };
  const double n_per = [&] {
    double n = 1;
    for (std::size_t d = 0; d < c.shape.size(); ++d)
      if (dims.empty() || std::find(dims.begin(), dims.end(), static_cast<std::int64_t>(d)) != dims.end()) n *= static_cast<double>(c.shape[d]);
    return n;
  }();
  const double scale = t == dtype::float32 ? 10.0 : 2.0;  // float32 sums accumulate in float
  check_all(sum(a, c.dims, keepdim), [&](const shape_t& i) {
    double s = 0;
    for (double v : slice_values(a, dims, keep_idx(i))) s += v;
    return round_to(s, t);
  }, scale);
  check_all(mean(a, c.dims, keepdim), [&](const shape_t& i) {
    double s = 0;
    for (double v : slice_values(a, dims, keep_idx(i))) s += v;
    return round_to(s / n_per, t);
  }, scale);
  if (n_per > 0) {
    check_all(amax(a, c.dims, keepdim), [&](const shape_t& i) {
      const auto v = slice_values(a, dims, keep_idx(i));
      return *std::max_element(v.begin(), v.end());
    });
    check_all(amin(a, c.dims, keepdim), [&](const shape_t& i) {
      const auto v = slice_values(a, dims, keep_idx(i));
      return *std::min_element(v.begin(), v.end());
    });
  }
  if (n_per > 1) {
    check_all(var(a, c.dims, true, keepdim), [&](const shape_t& i) {
      const auto v = slice_values(a, dims, keep_idx(i));
      double m = 0, ss = 0;
      for (double x : v) m += x;
      m /= static_cast<double>(v.size());
      for (double x : v) ss += (x - m) * (x - m);
      return round_to(ss / static_cast<double>(v.size() - 1), t);
    }, 2.0);
  }
}

TEST_CASE("reductions of integers sum into int64 and of bools count", "[tensors][reduction]") {
  const tensor i = from_vector<std::int32_t>({1, 2, 3, 4}, {2, 2});
  const tensor s = sum(i);
  CHECK(s.dtype() == dtype::int64);
  CHECK(s.item() == 10);
  CHECK(values(sum(i, {0})) == std::vector<double>{4, 6});
  CHECK(sum(from_vector<bool>({true, false, true})).item() == 2);
  CHECK(values(amax(i, {1})) == std::vector<double>{2, 4});
  CHECK_THROWS_AS(mean(i), troupe::error);
}

TEST_CASE("empty reductions: sum is 0, mean is NaN, max throws", "[tensors][reduction]") {
  const tensor e = zeros({0, 3});
  CHECK(sum(e).item() == 0.0);
  CHECK(std::isnan(mean(e).item()));
  CHECK(values(sum(e, {0})) == std::vector<double>{0, 0, 0});
  CHECK(amax(e, {1}).shape() == shape_t{0});
  try {
    amax(e);
    FAIL("expected bad_argument");
  } catch (const troupe::error& err) {
    CHECK(err.code() == errc::bad_argument);
  }
  CHECK_THROWS_AS(argmax(e, 0), troupe::error);
}

TEST_CASE("a float32 sum of a million ones is exact and of 0.1s accurate", "[tensors][reduction]") {
  CHECK(sum(ones({1 << 20})).item() == 1048576.0);
  const double s = sum(full({1 << 20}, 0.1)).item();
  CHECK(std::fabs(s - 0.1f * 1048576.0) < 0.1);  // a few float ulps; naive accumulation is off by ~1e3
}

TEST_CASE("argmax and argmin return the first extremum along a dim", "[tensors][reduction]") {
  const tensor a = from_vector<float>({1, 5, 5, 2, 2, 0, 7, -1, 7}, {3, 3});
  CHECK(values(argmax(a, 1)) == std::vector<double>{1, 0, 0});
  CHECK(values(argmin(a, 1)) == std::vector<double>{0, 2, 1});
  CHECK(values(argmax(a, 0)) == std::vector<double>{2, 0, 2});
  CHECK(argmax(a, 0, true).shape() == shape_t{1, 3});
  CHECK(argmax(a).item() == 6);
  CHECK(argmax(a.t(), 1).dtype() == dtype::int64);
  CHECK(values(argmax(a.t(), 1)) == std::vector<double>{2, 0, 2});
}

TEST_CASE("var supports the biased form and reduces over several dims", "[tensors][reduction]") {
  const tensor a = from_vector<double>({1, 2, 3, 4}, {2, 2});
  CHECK(var(a).item() == Approx(5.0 / 3.0));
  CHECK(var(a, {}, false).item() == Approx(1.25));
  CHECK(values(var(a, {1}, false)) == std::vector<double>{0.25, 0.25});
  CHECK(std::isnan(var(from_vector<double>({1.0})).item()));
}

TEST_CASE("sum_to undoes broadcasting and rejects incompatible shapes", "[tensors][reduction]") {
  const tensor g = ones({2, 3, 4});
  CHECK(values(sum_to(g, {4})) == std::vector<double>(4, 6.0));
  CHECK(sum_to(g, {3, 1}).shape() == shape_t{3, 1});
  CHECK(values(sum_to(g, {3, 1})) == std::vector<double>(3, 8.0));
  CHECK(sum_to(g, {}).item() == 24.0);
  CHECK(sum_to(g, {2, 3, 4}).is_same(g));
  CHECK_THROWS_AS(sum_to(g, {5}), troupe::error);
}

TEST_CASE("reductions reject bad and repeated dims", "[tensors][reduction]") {
  const tensor a = zeros({2, 3});
  try {
    sum(a, {2});
    FAIL("expected index_out_of_range");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::index_out_of_range);
  }
  CHECK_THROWS_AS(sum(a, {0, -2}), troupe::error);
  CHECK_THROWS_AS(argmax(a, 5), troupe::error);
}

TEST_CASE("max and min propagate NaN", "[tensors][reduction]") {
  const double nan = std::nan("");
  const tensor a = from_vector<double>({1, nan, 3});
  CHECK(std::isnan(amax(a).item()));
  CHECK(std::isnan(amin(a).item()));
  CHECK(argmax(a).item() == 1);
}

TEST_CASE("reductions over large transposed inputs match the reference", "[tensors][reduction]") {
  const tensor a = make_input({64, 48}, dtype::float64, layout::transposed, 3);
  check_all(sum(a, {1}), [&](const shape_t& i) {
    double s = 0;
    for (std::int64_t j = 0; j < 48; ++j) s += read_at(a, {i[0], j});
    return s;
  });
  check_all(amax(a, {0}), [&](const shape_t& i) {
    double m = -INFINITY;
    for (std::int64_t j = 0; j < 64; ++j) m = std::max(m, read_at(a, {j, i[0]}));
    return m;
  });
}
