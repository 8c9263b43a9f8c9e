// Tensor methods: views and aliasing, copies, item, in-place ops and the version counter,
// printing, and 16-bit float rounding.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "tensor_test_util.hpp"
#include "troupe/tensors/elementwise.hpp"

using namespace troupe;
using namespace troupe::test;

TEST_CASE("writing through a view changes the base", "[tensors][tensor]") {
  tensor base = arange(12, dtype::float32).reshape({3, 4});
  tensor row = base.select(0, 1);
  row.fill_(-1.0);
  CHECK(values(base.select(0, 1)) == std::vector<double>(4, -1.0));
  tensor col = base.slice(1, 0, 4, 2);  // columns 0 and 2
  col.mul_(10.0);
  CHECK(read_at(base, {0, 2}) == 20.0);
  CHECK(read_at(base, {0, 1}) == 1.0);
  tensor tr = base.t();
  tr.add_(ones({4, 3}));
  CHECK(read_at(base, {2, 3}) == 12.0);
  CHECK(tr.is_view());
  CHECK(tr.storage() == base.storage());
}

TEST_CASE("view errors on non-viewable layouts and reshape copies instead", "[tensors][tensor]") {
  const tensor a = arange(6, dtype::float32).reshape({2, 3});
  try {
    a.t().view({6});
    FAIL("expected invalid_view");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::invalid_view);
  }
  const tensor r = a.t().reshape({6});
  CHECK(values(r) == std::vector<double>{0, 3, 1, 4, 2, 5});
  CHECK(r.storage() != a.storage());
  CHECK(a.view({3, 2}).storage() == a.storage());
  CHECK_THROWS_AS(a.view({4}), troupe::error);
}

TEST_CASE("contiguous and clone copy non-contiguous data in logical order", "[tensors][tensor]") {
  const auto t = GENERATE(from_range(all_dtypes()));
  const tensor a = make_input({3, 4}, t, layout::transposed, 2);
  const tensor c = a.contiguous();
  CHECK(c.is_contiguous());
  CHECK(values(c) == values(a));
  const tensor e = make_input({3, 4}, t, layout::expanded, 2).clone();
  CHECK(e.is_contiguous());
  CHECK(values(e) == values(make_input({3, 4}, t, layout::expanded, 2)));
}

TEST_CASE("to converts dtypes with rounding and saturation rules", "[tensors][tensor]") {
  const tensor f = from_vector<float>({1.5f, -2.25f, 0.f, 3.7f});
  CHECK(values(f.to(dtype::int32)) == std::vector<double>{1, -2, 0, 3});
  CHECK(values(f.to(dtype::boolean)) == std::vector<double>{1, 1, 0, 1});
  CHECK(values(f.to(dtype::float64)) == values(f));
  CHECK(values(f.to(dtype::float16).to(dtype::float32))[3] == static_cast<double>(static_cast<float>(half(3.7f))));
}

TEST_CASE("half and bfloat16 conversions round to nearest even", "[tensors][tensor]") {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10 in binary16: ties to even -> 1.
  CHECK(static_cast<float>(half(1.0f + std::ldexp(1.0f, -11))) == 1.0f);
  // 1 + 3*2^-11 is halfway between 1+2^-10 and 1+2^-9: ties to even -> 1 + 2^-9.
  CHECK(static_cast<float>(half(1.0f + 3 * std::ldexp(1.0f, -11))) == 1.0f + std::ldexp(1.0f, -9));
  CHECK(static_cast<float>(half(65520.0f)) == std::numeric_limits<float>::infinity());
  CHECK(std::isnan(static_cast<float>(half(std::nanf("")))));
  // bfloat16 keeps 8 significant bits: 1 + 2^-8 ties to 1, 1 + 3*2^-8 ties to 1 + 2^-6.
  CHECK(static_cast<float>(bfloat16(1.0f + std::ldexp(1.0f, -8))) == 1.0f);
  CHECK(static_cast<float>(bfloat16(1.0f + 3 * std::ldexp(1.0f, -8))) == 1.0f + std::ldexp(1.0f, -6));
  // through tensors: float32 -> float16 copy uses the same rounding
  const tensor t = from_vector<float>({1.0f + std::ldexp(1.0f, -11), 1.0f + 3 * std::ldexp(1.0f, -11)}).to(dtype::float16);
  CHECK(values(t) == std::vector<double>{1.0, 1.0 + std::ldexp(1.0, -9)});
  // ops on 16-bit floats round once on store: 2049 is not representable, 2048 + 2 is
  const tensor h = add(full({1}, 2048.0, dtype::float16), full({1}, 1.0, dtype::float16));
  CHECK(h.item() == 2048.0);
}

TEST_CASE("item returns the single element and rejects other sizes", "[tensors][tensor]") {
  CHECK(scalar_tensor(2.5).item() == 2.5);
  CHECK(from_vector<std::int64_t>({7}).item() == 7.0);
  CHECK(from_vector<std::int64_t>({7}).item<std::int64_t>() == 7);
  CHECK(make_input({2, 3}, dtype::float32, layout::transposed).select(0, 1).select(0, 2).item() ==
        read_at(make_input({2, 3}, dtype::float32, layout::transposed), {1, 2}));
  try {
    zeros({2}).item();
    FAIL("expected bad_argument");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::bad_argument);
    CHECK_THAT(std::string(e.what()), Catch::Contains("item") && Catch::Contains("[2]"));
  }
  CHECK_THROWS_AS(zeros({0}).item(), troupe::error);
}

TEST_CASE("in-place ops compute in place, broadcast the operand and bump the version", "[tensors][tensor]") {
  tensor a = from_vector<float>({1, 2, 3, 4}, {2, 2});
  const auto v0 = a.version();
  a.add_(from_vector<float>({10, 20}), 2.0);
  CHECK(values(a) == std::vector<double>{21, 42, 23, 44});
  a.sub_(ones({2, 2}));
  a.mul_(from_vector<double>({2, 1}, {2, 1}));
  CHECK(values(a) == std::vector<double>{40, 82, 22, 43});
  a.div_(2.0);
  a.add_(1.0);
  a.mul_(2.0);
  CHECK(values(a) == std::vector<double>{42, 84, 24, 45});
  a.div_(from_vector<float>({2, 3}));
  CHECK(values(a) == std::vector<double>{21, 28, 12, 15});
  a.zero_();
  CHECK(values(a) == std::vector<double>(4, 0.0));
  CHECK(a.version() == v0 + 8);  // one bump per in-place call
}

TEST_CASE("in-place ops reject results that do not fit the tensor", "[tensors][tensor]") {
  tensor i = from_vector<std::int32_t>({1, 2});
  CHECK_THROWS_AS(i.add_(from_vector<float>({1.f, 1.f})), troupe::error);
  CHECK_THROWS_AS(i.div_(2.0), troupe::error);
  CHECK_THROWS_AS(i.mul_(1.5), troupe::error);
  i.add_(3.0);
  CHECK(values(i) == std::vector<double>{4, 5});
  tensor f = zeros({2, 2});
  try {
    f.add_(ones({3}));
    FAIL("expected shape_mismatch");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::shape_mismatch);
  }
  CHECK_THROWS_AS(f.add_(ones({2, 2, 2})), troupe::error);
}

TEST_CASE("in-place ops with an overlapping operand read the old values", "[tensors][tensor]") {
  tensor a = arange(4, dtype::float32);
  a.slice(0, 1, 4).add_(a.slice(0, 0, 3));  // a[1:] += a[:-1] with the old a
  CHECK(values(a) == std::vector<double>{0, 1, 3, 5});
  tensor b = arange(4, dtype::float32);
  b.add_(b);
  CHECK(values(b) == std::vector<double>{0, 2, 4, 6});
}

TEST_CASE("printing shows dtype, device, shape and values", "[tensors][tensor]") {
  const std::string s = from_vector<float>({1.5f, -2.f, 3.f, 4.f}, {2, 2}).to_string();
  CHECK_THAT(s, Catch::Contains("float32") && Catch::Contains("cpu") && Catch::Contains("[2, 2]") &&
                    Catch::Contains("1.5000") && Catch::Contains("-2.0000"));
  CHECK_THAT(from_vector<std::int64_t>({7, 8}).to_string(), Catch::Contains("7, 8") && Catch::Contains("int64"));
  CHECK_THAT(from_vector<bool>({true, false}).to_string(), Catch::Contains("True, False"));
  CHECK_THAT(scalar_tensor(3.0).to_string(), Catch::Contains("3.0000"));
  const std::string big = arange(5000, dtype::int64).to_string();
  CHECK_THAT(big, Catch::Contains("...") && Catch::Contains("4999") && Catch::Contains("[5000]"));
  CHECK(big.size() < 200);
  CHECK_THAT(zeros({0, 2}).to_string(), Catch::Contains("[]"));
  CHECK_THAT(make_input({2, 3}, dtype::float16, layout::transposed).to_string(), Catch::Contains("float16"));
}

TEST_CASE("calls on an undefined tensor throw invalid_state", "[tensors][tensor]") {
  tensor u;
  try {
    (void)u.shape();
    FAIL("expected invalid_state");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::invalid_state);
  }
  CHECK_THROWS_AS(relu(u), troupe::error);
}
