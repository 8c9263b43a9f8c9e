// Matrix products against a float64 triple-loop reference.
#include <catch2/catch.hpp>

#include "tensor_test_util.hpp"
#include "troupe/tensors/linalg.hpp"

using namespace troupe;
using namespace troupe::test;

namespace {
// Reference batched product of (>=2-d) a and b with broadcast batch dims, at index i.
double ref_mm(const tensor& a, const tensor& b, const shape_t& i) {
  const std::int64_t k = a.size(-1);
  const std::size_t nd = i.size();
  double s = 0;
  for (std::int64_t p = 0; p < k; ++p) {
    shape_t ia(i.begin(), i.end() - 2), ib(i.begin(), i.end() - 2);
    ia.insert(ia.end(), {i[nd - 2], p});
    ib.insert(ib.end(), {p, i[nd - 1]});
    s += broadcast_read(a, ia) * broadcast_read(b, ib);
  }
  return s;
}

struct mcase {
  shape_t a, b;
};
}  // namespace

TEST_CASE("matmul matches a reference for 2-d and batched operands in every layout", "[tensors][linalg]") {
  const auto c = GENERATE(values<mcase>({{{3, 4}, {4, 5}},
                                         {{2, 3, 4}, {2, 4, 5}},
                                         {{2, 3, 4}, {4, 5}},
                                         {{3, 4}, {2, 4, 5}},
                                         {{2, 1, 3, 4}, {3, 4, 2}},
                                         {{0, 4}, {4, 5}},
                                         {{3, 0}, {0, 5}},
                                         {{33, 17}, {17, 9}}}));
  const auto la = GENERATE(layout::contiguous, layout::transposed, layout::strided);
  const auto lb = GENERATE(layout::contiguous, layout::transposed, layout::expanded);
  const auto t = GENERATE(dtype::float32, dtype::float64, dtype::float16, dtype::bfloat16, dtype::int64);
  const tensor a = make_input(c.a, t, la, 1);
  const tensor b = make_input(c.b, t, lb, 2);
  INFO(shape_to_string(c.a) << " @ " << shape_to_string(c.b) << " " << to_string(t) << " " << to_string(la) << "/"
                            << to_string(lb));
  const tensor out = matmul(a, b);
  CHECK(out.dtype() == t);
  check_all(out, [&](const shape_t& i) { return round_to(ref_mm(a, b, i), t); }, 4.0);
}

TEST_CASE("matmul handles 1-d operands as torch.matmul does", "[tensors][linalg]") {
  const tensor v = from_vector<double>({1, 2, 3});
  const tensor m = from_vector<double>({1, 0, 0, 1, 1, 1}, {3, 2});
  CHECK(matmul(v, v).dim() == 0);
  CHECK(matmul(v, v).item() == 14.0);
  CHECK(matmul(v, m).shape() == shape_t{2});
  CHECK(values(matmul(v, m)) == std::vector<double>{4, 5});
  CHECK(values(matmul(m.t(), v)) == std::vector<double>{4, 5});
  const tensor bm = from_vector<double>({1, 0, 0, 1, 1, 1, 2, 2, 2, 2, 2, 2}, {2, 3, 2});
  CHECK(matmul(v, bm).shape() == shape_t{2, 2});
  CHECK(values(matmul(v, bm)) == std::vector<double>{4, 5, 12, 12});
}

TEST_CASE("bmm and addmm compute batched and fused products", "[tensors][linalg]") {
  const tensor a = make_input({2, 3, 4}, dtype::float64, layout::contiguous, 1);
  const tensor b = make_input({2, 4, 5}, dtype::float64, layout::contiguous, 2);
  check_all(bmm(a, b), [&](const shape_t& i) { return ref_mm(a, b, i); });
  const tensor x = make_input({3, 4}, dtype::float32, layout::transposed, 3);
  const tensor w = make_input({5, 4}, dtype::float32, layout::contiguous, 4);
  const tensor bias = make_input({5}, dtype::float32, layout::contiguous, 5);
  const tensor out = addmm(bias, x, w.t(), 0.5, 2.0);
  const tensor wt = w.t();
  check_all(out, [&](const shape_t& i) { return 0.5 * read_at(bias, {i[1]}) + 2.0 * ref_mm(x, wt, i); });
  const tensor out0 = addmm(bias, x, wt, 0.0, 1.0);
  check_all(out0, [&](const shape_t& i) { return ref_mm(x, wt, i); });
}

TEST_CASE("matrix product errors name shapes and dtypes", "[tensors][linalg]") {
  try {
    matmul(zeros({2, 3}), zeros({4, 5}));
    FAIL("expected shape_mismatch");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::shape_mismatch);
    CHECK_THAT(std::string(e.what()), Catch::Contains("[2, 3]") && Catch::Contains("[4, 5]"));
  }
  try {
    matmul(zeros({2, 3}), zeros({3, 5}, dtype::float64));
    FAIL("expected dtype_mismatch");
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::dtype_mismatch);
  }
  CHECK_THROWS_AS(matmul(zeros({2, 2, 3}), zeros({3, 3, 5})), troupe::error);
  CHECK_THROWS_AS(bmm(zeros({2, 3}), zeros({3, 5})), troupe::error);
  CHECK_THROWS_AS(addmm(zeros({7}), zeros({2, 3}), zeros({3, 5})), troupe::error);
  CHECK_THROWS_AS(matmul(scalar_tensor(1.0), zeros({3})), troupe::error);
}
