// Shape arithmetic (troupe/tensors/shape.hpp): printing, contiguous strides, element and byte
// counts, and broadcasting. Overflow bounds are in bounded_archive_test.cpp.
#include <catch2/catch.hpp>

#include <limits>

#include "troupe/tensors/error.hpp"
#include "troupe/tensors/shape.hpp"

using namespace troupe;

TEST_CASE("a shape prints as a bracketed list", "[tensors][shape]") {
  CHECK(shape_to_string({}) == "[]");
  CHECK(shape_to_string({7}) == "[7]");
  CHECK(shape_to_string({2, 3, 4}) == "[2, 3, 4]");
}

TEST_CASE("contiguous strides count elements from the last dim", "[tensors][shape]") {
  CHECK(contiguous_strides({}).empty());
  CHECK(contiguous_strides({2, 3, 4}) == shape_t{12, 4, 1});
  // Size-1 and size-0 dims step like size 1, so the others keep their strides.
  CHECK(contiguous_strides({2, 1, 4}) == shape_t{4, 4, 1});
  CHECK(contiguous_strides({3, 0, 5}) == shape_t{5, 5, 1});
}

TEST_CASE("contiguous strides of an empty shape saturate instead of overflowing", "[tensors][shape]") {
  const std::int64_t big = std::int64_t{1} << 62;
  const shape_t st = contiguous_strides({0, big, 4});
  CHECK(st[2] == 1);
  CHECK(st[1] == 4);
  CHECK(st[0] == std::numeric_limits<std::int64_t>::max());
}

TEST_CASE("a negative size is refused with the shape named", "[tensors][shape]") {
  CHECK_THROWS_WITH(numel_of({2, -1}), Catch::Contains("[2, -1]"));
  CHECK_THROWS_MATCHES(nbytes_of({-3}, dtype::float32), error,
                       Catch::Predicate<error>([](const error& e) { return e.code() == errc::bad_argument; }));
}

TEST_CASE("broadcasting follows NumPy's rules", "[tensors][shape]") {
  CHECK(broadcast_shapes({3, 1}, {1, 4}, "add") == shape_t{3, 4});
  CHECK(broadcast_shapes({5}, {2, 1, 5}, "add") == shape_t{2, 1, 5});
  CHECK(broadcast_shapes({}, {2, 3}, "add") == shape_t{2, 3});
  CHECK(broadcast_shapes({2, 0}, {1, 1}, "add") == shape_t{2, 0});
}

TEST_CASE("shapes that do not broadcast fail naming the op, both shapes and the dim", "[tensors][shape]") {
  try {
    broadcast_shapes({2, 3}, {4, 3}, "mul");
    FAIL("no error");
  } catch (const error& e) {
    CHECK(e.code() == errc::shape_mismatch);
    CHECK_THAT(e.message(), Catch::Contains("mul") && Catch::Contains("[2, 3]") && Catch::Contains("[4, 3]") &&
                                Catch::Contains("dim 0"));
  }
}
