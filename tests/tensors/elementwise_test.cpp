// Elementwise ops against float64 references computed by plain loops, over shapes (with
// broadcasting and zero-size dims), layouts (contiguous, transposed, strided, expanded) and
// dtypes.
#include <catch2/catch.hpp>

#include <cmath>

#include "tensor_test_util.hpp"
#include "troupe/tensors/elementwise.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {
struct bcase {
  shape_t a, b;
};

double ref_binary(const std::string& op, double x, double y) {
  if (op == "add") return x + y;
  if (op == "sub") return x - y;
  if (op == "mul") return x * y;
  if (op == "div") return x / y;
  if (op == "maximum") return std::max(x, y);
  return std::min(x, y);
}

tensor run_binary(const std::string& op, const tensor& a, const tensor& b) {
  if (op == "add") return add(a, b);
  if (op == "sub") return sub(a, b);
  if (op == "mul") return mul(a, b);
  if (op == "div") return div(a, b);
  if (op == "maximum") return maximum(a, b);
  return minimum(a, b);
}
}  // namespace

TEST_CASE("binary ops match a float64 reference across shapes, layouts and dtypes", "[tensors][elementwise]") {
  const auto shapes = GENERATE(values<bcase>({{{3, 4}, {3, 4}},
                                              {{2, 3, 4}, {4}},
                                              {{2, 1, 4}, {3, 1}},
                                              {{0, 4}, {4}},
                                              {{5}, {}},
                                              {{4, 5}, {4, 5}},
                                              {{1000}, {1000}}}));
  const auto l = GENERATE(layout::contiguous, layout::transposed, layout::strided, layout::expanded);
  const auto t = GENERATE(dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16, dtype::int32, dtype::int64);
  const auto op = GENERATE(as<std::string>{}, "add", "sub", "mul", "div", "maximum", "minimum");
  const tensor a = make_input(shapes.a, t, l, 1);
  const bool nonzero = op == "div";
  const tensor b = make_input(shapes.b, t, layout::contiguous, 5, nonzero);
  INFO(op << " " << shape_to_string(shapes.a) << " x " << shape_to_string(shapes.b) << " " << to_string(t) << " "
          << to_string(l));
  const tensor out = run_binary(op, a, b);
  CHECK(out.shape() == broadcast_shapes(shapes.a, shapes.b, "test"));
  CHECK(out.dtype() == (op == "div" && !is_floating(t) ? dtype::float32 : t));
  check_all(out, [&](const shape_t& i) {
    return round_to(ref_binary(op, broadcast_read(a, i), broadcast_read(b, i)), out.dtype());
  });
}

TEST_CASE("binary ops promote mixed dtypes as PyTorch does", "[tensors][elementwise]") {
  const tensor i = from_vector<std::int32_t>({1, 2, 3});
  const tensor f = from_vector<float>({0.5f, 0.5f, 0.5f});
  const tensor d = from_vector<double>({1, 1, 1});
  CHECK((i + f).dtype() == dtype::float32);
  CHECK((f + d).dtype() == dtype::float64);
  CHECK((i + from_vector<std::int64_t>({1, 1, 1})).dtype() == dtype::int64);
  CHECK(add(from_vector<half>({half(1.f)}), from_vector<bfloat16>({bfloat16(1.f)})).dtype() == dtype::float32);
  CHECK(div(i, i).dtype() == dtype::float32);
  CHECK(values(div(i, from_vector<std::int32_t>({2, 2, 2}))) == std::vector<double>{0.5, 1.0, 1.5});
  CHECK((i * 2.0).dtype() == dtype::int32);
  CHECK((i * 2.5).dtype() == dtype::float32);
  CHECK((f * 2.0).dtype() == dtype::float32);
  CHECK(values(add(i, f)) == std::vector<double>{1.5, 2.5, 3.5});
}

TEST_CASE("add and sub apply alpha to the second operand", "[tensors][elementwise]") {
  const tensor a = from_vector<double>({1, 2}), b = from_vector<double>({10, 20});
  CHECK(values(add(a, b, 0.5)) == std::vector<double>{6, 12});
  CHECK(values(sub(a, b, 2.0)) == std::vector<double>{-19, -38});
}

TEST_CASE("scalar forms and reversed scalar forms compute the right values", "[tensors][elementwise]") {
  const auto l = GENERATE(layout::contiguous, layout::transposed, layout::strided);
  const auto t = GENERATE(dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16);
  const tensor a = make_input({3, 5}, t, l, 2, true);
  check_all(a + 1.5, [&](const shape_t& i) { return round_to(read_at(a, i) + 1.5, t); });
  check_all(a - 1.5, [&](const shape_t& i) { return round_to(read_at(a, i) - 1.5, t); });
  check_all(a * 3.0, [&](const shape_t& i) { return round_to(read_at(a, i) * 3.0, t); });
  check_all(a / 4.0, [&](const shape_t& i) { return round_to(read_at(a, i) / 4.0, t); });
  check_all(2.0 - a, [&](const shape_t& i) { return round_to(2.0 - read_at(a, i), t); });
  check_all(2.0 / a, [&](const shape_t& i) { return round_to(2.0 / read_at(a, i), t); });
  check_all(pow(a, 2.0), [&](const shape_t& i) { return round_to(std::pow(read_at(a, i), 2.0), t); });
  check_all(pow(a, 0.5), [&](const shape_t& i) { return round_to(std::pow(read_at(a, i), 0.5), t); });
  check_all(pow(a, a), [&](const shape_t& i) { return round_to(std::pow(read_at(a, i), read_at(a, i)), t); }, 2.0);
}

TEST_CASE("unary ops match a float64 reference", "[tensors][elementwise]") {
  const auto l = GENERATE(layout::contiguous, layout::transposed, layout::strided, layout::expanded);
  const auto t = GENERATE(dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16);
  const tensor a = make_input({4, 6}, t, l, 3);
  const tensor p = make_input({4, 6}, t, l, 3, true);
  INFO(to_string(t) << " " << to_string(l));
  auto chk = [&](const tensor& out, const tensor& in, double (*f)(double)) {
    CHECK(out.dtype() == t);
    CHECK(out.shape() == in.shape());
    check_all(out, [&](const shape_t& i) { return round_to(f(read_at(in, i)), t); }, 2.0);
  };
  chk(neg(a), a, [](double x) { return -x; });
  chk(abs(a), a, [](double x) { return std::fabs(x); });
  chk(exp(a), a, [](double x) { return std::exp(x); });
  chk(log(p), p, [](double x) { return std::log(x); });
  chk(sqrt(p), p, [](double x) { return std::sqrt(x); });
  chk(rsqrt(p), p, [](double x) { return 1.0 / std::sqrt(x); });
  chk(relu(a), a, [](double x) { return x > 0 ? x : 0.0; });
  chk(sigmoid(a), a, [](double x) { return 1.0 / (1.0 + std::exp(-x)); });
  chk(tanh(a), a, [](double x) { return std::tanh(x); });
  chk(gelu(a), a, [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0))); });
  chk(sign(a), a, [](double x) { return static_cast<double>((0.0 < x) - (x < 0.0)); });
}

TEST_CASE("unary math on integers gives float32 while neg abs relu sign keep the dtype", "[tensors][elementwise]") {
  const tensor i = from_vector<std::int64_t>({-2, 0, 3});
  CHECK(exp(i).dtype() == dtype::float32);
  CHECK(values(exp(i))[2] == Approx(std::exp(3.0)));
  CHECK(neg(i).dtype() == dtype::int64);
  CHECK(values(neg(i)) == std::vector<double>{2, 0, -3});
  CHECK(values(abs(i)) == std::vector<double>{2, 0, 3});
  CHECK(values(relu(i)) == std::vector<double>{0, 0, 3});
  CHECK(values(sign(i)) == std::vector<double>{-1, 0, 1});
  CHECK_THROWS_AS(neg(from_vector<bool>({true})), troupe::error);
}

TEST_CASE("comparisons give bool tensors and broadcast", "[tensors][elementwise]") {
  const auto t = GENERATE(dtype::float32, dtype::float64, dtype::int32, dtype::int64, dtype::float16);
  const tensor a = make_input({3, 4}, t, layout::transposed, 1);
  const tensor b = make_input({4}, t, layout::contiguous, 2);
  const tensor r = lt(a, b);
  CHECK(r.dtype() == dtype::boolean);
  check_all(r, [&](const shape_t& i) { return broadcast_read(a, i) < broadcast_read(b, i) ? 1.0 : 0.0; });
  check_all(eq(a, b), [&](const shape_t& i) { return broadcast_read(a, i) == broadcast_read(b, i) ? 1.0 : 0.0; });
  check_all(ne(a, b), [&](const shape_t& i) { return broadcast_read(a, i) != broadcast_read(b, i) ? 1.0 : 0.0; });
  check_all(le(a, b), [&](const shape_t& i) { return broadcast_read(a, i) <= broadcast_read(b, i) ? 1.0 : 0.0; });
  check_all(gt(a, b), [&](const shape_t& i) { return broadcast_read(a, i) > broadcast_read(b, i) ? 1.0 : 0.0; });
  check_all(ge(a, 0.5), [&](const shape_t& i) { return read_at(a, i) >= 0.5 ? 1.0 : 0.0; });
  check_all(lt(a, 0.5), [&](const shape_t& i) { return read_at(a, i) < 0.5 ? 1.0 : 0.0; });
}

TEST_CASE("where selects elementwise with broadcasting and rejects non-bool conditions", "[tensors][elementwise]") {
  const tensor cond = from_vector<bool>({true, false, true}, {3, 1});
  const tensor a = make_input({3, 4}, dtype::float32, layout::strided, 1);
  const tensor b = scalar_tensor(7.0, dtype::float64);
  const tensor r = where(cond, a, b);
  CHECK(r.dtype() == dtype::float64);
  check_all(r, [&](const shape_t& i) { return broadcast_read(cond, i) != 0 ? read_at(a, i) : 7.0; });
  try {
    where(from_vector<float>({1.f}), a, b);
    FAIL("expected dtype_mismatch");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::dtype_mismatch);
  }
}

TEST_CASE("equal and allclose compare values across dtypes with NaN rules", "[tensors][elementwise]") {
  const tensor a = from_vector<float>({1.f, 2.f, 3.f});
  CHECK(equal(a, from_vector<double>({1, 2, 3})));
  CHECK_FALSE(equal(a, from_vector<float>({1.f, 2.f, 4.f})));
  CHECK_FALSE(equal(a, from_vector<float>({1.f, 2.f})));
  CHECK(allclose(a, from_vector<float>({1.f, 2.f, 3.00001f})));
  CHECK_FALSE(allclose(a, from_vector<float>({1.f, 2.f, 3.1f})));
  const double inf = std::numeric_limits<double>::infinity(), nan = std::nan("");
  CHECK(allclose(from_vector<double>({inf, 1}), from_vector<double>({inf, 1})));
  CHECK_FALSE(allclose(from_vector<double>({nan}), from_vector<double>({nan})));
  CHECK(allclose(from_vector<double>({nan}), from_vector<double>({nan}), 1e-5, 1e-8, true));
  CHECK_FALSE(equal(from_vector<double>({nan}), from_vector<double>({nan})));
}

TEST_CASE("elementwise errors name the op and the shapes", "[tensors][elementwise]") {
  const tensor a = zeros({2, 3}), b = zeros({4});
  try {
    add(a, b);
    FAIL("expected shape_mismatch");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::shape_mismatch);
    CHECK_THAT(std::string(e.what()), Catch::Contains("add") && Catch::Contains("[2, 3]") && Catch::Contains("[4]"));
  }
  CHECK_THROWS_AS(mul(tensor(), a), troupe::error);
  CHECK_THROWS_AS(lt(a, b), troupe::error);
}

TEST_CASE("zero-size tensors flow through elementwise ops", "[tensors][elementwise]") {
  const tensor a = zeros({0, 3});
  CHECK(add(a, ones({3})).shape() == shape_t{0, 3});
  CHECK(exp(a).numel() == 0);
  CHECK(lt(a, 1.0).shape() == shape_t{0, 3});
}

TEST_CASE("large transposed operands take the tiled walk and stay correct", "[tensors][elementwise]") {
  const auto shape = GENERATE(shape_t{40, 50}, shape_t{3, 33, 129}, shape_t{130, 32});
  const auto t = GENERATE(dtype::float32, dtype::float64, dtype::float16);
  const tensor a = make_input(shape, t, layout::transposed, 1);
  const tensor b = make_input(shape, t, layout::contiguous, 2);
  check_all(add(a, b), [&](const shape_t& i) { return round_to(read_at(a, i) + read_at(b, i), t); });
  check_all(relu(a), [&](const shape_t& i) { return std::max(read_at(a, i), 0.0); });
  check_all(a.contiguous(), [&](const shape_t& i) { return read_at(a, i); });
  tensor c = b.clone();
  c.mul_(a);
  check_all(c, [&](const shape_t& i) { return round_to(read_at(a, i) * read_at(b, i), t); });
}
