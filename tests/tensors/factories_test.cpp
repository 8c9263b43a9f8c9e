// Factories and seeded random draws.
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "tensor_test_util.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/reduction.hpp"

using namespace troupe;
using namespace troupe::test;

TEST_CASE("constant factories fill every dtype", "[tensors][factories]") {
  const auto t = GENERATE(from_range(all_dtypes()));
  CHECK(values(zeros({2, 3}, t)) == std::vector<double>(6, 0.0));
  CHECK(values(ones({4}, t)) == std::vector<double>(4, 1.0));
  CHECK(values(full({2}, 3.0, t)) == std::vector<double>(2, t == dtype::boolean ? 1.0 : 3.0));
  const tensor e = empty({2, 0, 3}, t);
  CHECK(e.numel() == 0);
  CHECK(e.dtype() == t);
  CHECK(scalar_tensor(2.0, t).dim() == 0);
  CHECK(zeros_like(e).shape() == e.shape());
  CHECK_THROWS_AS(empty({-1}, t), troupe::error);
}

TEST_CASE("arange follows PyTorch's dtype defaults", "[tensors][factories]") {
  CHECK(arange(5).dtype() == dtype::int64);
  CHECK(values(arange(5)) == std::vector<double>{0, 1, 2, 3, 4});
  CHECK(values(arange(1, 2, 0.25)) == std::vector<double>{1, 1.25, 1.5, 1.75});
  CHECK(arange(1, 2, 0.25).dtype() == dtype::float32);
  CHECK(values(arange(5, 0, -2)) == std::vector<double>{5, 3, 1});
  CHECK(arange(3, dtype::float64).dtype() == dtype::float64);
  CHECK_THROWS_AS(arange(0, 1, 0), troupe::error);
  CHECK_THROWS_AS(arange(0, 1, -1), troupe::error);
}

TEST_CASE("from_vector and from_blob hold the given values", "[tensors][factories]") {
  CHECK(values(from_vector<std::int32_t>({1, 2, 3, 4}, {2, 2})) == std::vector<double>{1, 2, 3, 4});
  CHECK(values(from_vector<bool>({true, false})) == std::vector<double>{1, 0});
  CHECK_THROWS_AS(from_vector<float>({1.f, 2.f}, {3}), troupe::error);
  std::vector<float> mem{1, 2, 3, 4, 5, 6};
  tensor b = from_blob(mem.data(), {2, 3}, dtype::float32);
  CHECK(b.storage()->kind() == storage_kind::external);
  mem[4] = 50;
  CHECK(read_at(b, {1, 1}) == 50.0);  // no copy
  b.mul_(2.0);
  CHECK(mem[0] == 2.0f);
}

TEST_CASE("the same seed gives the same tensor and advancing the generator changes it", "[tensors][factories][random]") {
  const auto t = GENERATE(dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16);
  generator g1(42), g2(42);
  const tensor a = rand({3, 5}, g1, t), b = rand({3, 5}, g2, t);
  CHECK(equal(a, b));
  CHECK(g1.offset() == 4);  // ceil(15 / 4) blocks
  const tensor c = rand({3, 5}, g1, t);
  CHECK_FALSE(equal(a, c));
  generator g3(43);
  CHECK_FALSE(equal(a, rand({3, 5}, g3, t)));
  generator g4(42);
  g4.set_offset(4);
  CHECK(equal(c, rand({3, 5}, g4, t)));
  generator n1(7), n2(7);
  CHECK(equal(randn({7}, n1, t), randn({7}, n2, t)));
}

TEST_CASE("rand stays in range and is roughly uniform", "[tensors][factories][random]") {
  generator g(1);
  const tensor r = rand({100000}, g, dtype::float32, -2.0, 3.0);
  CHECK(amin(r).item() >= -2.0);
  CHECK(amax(r).item() < 3.0);
  CHECK(mean(r).item() == Approx(0.5).margin(0.03));           // sd of the mean ~ 0.0046
  CHECK(var(r).item() == Approx(25.0 / 12.0).margin(0.05));    // uniform variance (b-a)^2/12
  const tensor u = rand({1000}, g, dtype::float64);
  CHECK(amax(u).item() < 1.0);
  CHECK(amin(u).item() >= 0.0);
}

TEST_CASE("randn has the requested mean and std within statistical bounds", "[tensors][factories][random]") {
  generator g(3);
  const tensor r = randn({200000}, g, dtype::float32, 1.5, 2.0);
  CHECK(mean(r).item() == Approx(1.5).margin(0.03));  // sd of the mean 2/sqrt(2e5) ~ 0.0045
  CHECK(std::sqrt(var(r).item()) == Approx(2.0).margin(0.03));
  // about 68.3% within one std
  const double within = sum(lt(abs(sub(r, 1.5)), 2.0)).item() / 200000.0;
  CHECK(within == Approx(0.6827).margin(0.01));
  tensor x = empty({1001}, dtype::float64);  // odd count
  normal_(x, g, 0.0, 1.0);
  CHECK(std::isfinite(sum(x).item()));
  CHECK_THROWS_AS(randn({2}, g, dtype::int64), troupe::error);
  CHECK_THROWS_AS(randn({2}, g, dtype::float32, 0.0, -1.0), troupe::error);
}

TEST_CASE("randint covers the range and randperm is a permutation", "[tensors][factories][random]") {
  generator g(5);
  const tensor r = randint(-3, 4, {10000}, g);
  CHECK(r.dtype() == dtype::int64);
  CHECK(amin(r).item() == -3);
  CHECK(amax(r).item() == 3);
  CHECK_THROWS_AS(randint(2, 2, {3}, g), troupe::error);
  const tensor p = randperm(100, g);
  const auto v = values(p);
  CHECK(std::set<double>(v.begin(), v.end()).size() == 100);
  CHECK(*std::max_element(v.begin(), v.end()) == 99);
  generator h(5);
  randint(-3, 4, {10000}, h);
  CHECK(equal(randperm(100, h), p));
}

TEST_CASE("uniform_ fills a non-contiguous view in contiguous order of the view", "[tensors][factories][random]") {
  tensor base = zeros({4, 6}, dtype::float64);
  tensor v = base.t();
  generator g1(9), g2(9);
  uniform_(v, g1);
  const tensor ref = rand({6, 4}, g2, dtype::float64);
  CHECK(equal(v, ref));
  CHECK(base.version() > 0);
}
