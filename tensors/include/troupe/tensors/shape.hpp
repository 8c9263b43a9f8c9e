#pragma once
/// \file shape.hpp
/// Shapes and strides as plain vectors, and the arithmetic on them: element and byte counts,
/// contiguous strides, broadcasting. All checks throw troupe::error naming the shape.

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/tensors/dtype.hpp"

namespace troupe {

/// Sizes or strides (strides are in elements, not bytes).
using shape_t = std::vector<std::int64_t>;

/// "[2, 3]"
std::string shape_to_string(const shape_t& s);

/// Contiguous strides for `sizes`.
shape_t contiguous_strides(const shape_t& sizes);
/// Product of sizes. Throws bad_argument naming the shape when a size is negative or the product
/// of the non-zero sizes does not fit in an int64 (so contiguous strides never overflow).
std::int64_t numel_of(const shape_t& sizes);
/// Bytes of a contiguous tensor of `sizes` and `dt`; throws bad_argument as numel_of does, and
/// when the byte count does not fit in an int64.
std::int64_t nbytes_of(const shape_t& sizes, dtype dt);
/// Shape of broadcasting a with b (NumPy rules); throws shape_mismatch naming `op` and both shapes.
shape_t broadcast_shapes(const shape_t& a, const shape_t& b, const char* op);

}  // namespace troupe
