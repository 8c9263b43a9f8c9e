#pragma once
// Elementwise reduction of several equally long arrays, for the CPU process group.

#include <cstddef>

#include "troupe/ddp/process_group.hpp"
#include "troupe/tensors/dtype.hpp"

namespace troupe::ddp::detail {

/// out[i] = op(srcs[0][i], srcs[1][i], ..., srcs[nsrc-1][i]) folded in source order, for `n`
/// elements of `dt`; avg divides the sum by `divisor`. 16-bit floats accumulate in float. Any
/// output may alias any source (blocks are read completely before they are written). `out2`
/// (optional) receives a second copy.
void reduce_arrays(troupe::dtype dt, reduce_op op, int divisor, const std::byte* const* srcs, int nsrc,
                   std::byte* out, std::byte* out2, std::size_t n);

}  // namespace troupe::ddp::detail
