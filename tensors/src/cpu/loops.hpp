#pragma once
// Private: the iteration machinery shared by the CPU kernels (tensors/src/cpu/*.cpp).
//
// Note [CPU loops]
// ----------------
// Every elementwise kernel sees N operands of one shape with arbitrary strides (0-strides from
// expand included). `make_plan` drops size-1 dims and coalesces adjacent dims that are
// contiguous with each other in *every* operand, so a contiguous (or contiguous-after-expand)
// tensor becomes one long row. `for_each_row` then walks the outer dims with a small N-d index
// counter. It hands each innermost row (pointers, length, inner strides) to the kernel. The
// kernel takes a fast path when all inner strides are 1, else a strided loop. The fast path is
// a plain `for (i..n) o[i] = f(a[i], b[i])` loop over __restrict pointers; GCC auto-vectorises
// it at -O3.
//
//      sizes [2,3,4] strides {12,4,1}  ->  sizes [24] strides {1}      (one row of 24)
//      sizes [2,3,4] out {12,4,1} b {0,4,1} -> sizes [2,12] out {12,1} b {0,1}

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "troupe/tensors/tensor.hpp"

namespace troupe::kernels::cpu::detail {

/// The type 16-bit floats and bools are computed in; everything else computes in itself.
template <class T> struct compute_type { using type = T; };
template <> struct compute_type<half> { using type = float; };
template <> struct compute_type<bfloat16> { using type = float; };
template <> struct compute_type<bool> { using type = int; };
template <class T> using compute_t = typename compute_type<T>::type;

template <class T> inline compute_t<T> load(const T* p) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) return static_cast<float>(*p);
  else return static_cast<compute_t<T>>(*p);
}
template <class T, class C> inline void store(T* p, C v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) *p = T(static_cast<float>(v));
  else if constexpr (std::is_same_v<T, bool>) *p = v != C{};
  else *p = static_cast<T>(v);
}

/// A coalesced iteration space over N operands (strides in elements, innermost dim last).
template <std::size_t N>
struct loop_plan {
  shape_t sizes;
  std::array<shape_t, N> strides;
  std::int64_t numel = 1;
};

/// Builds the plan for operands of shape `sizes` (see Note [CPU loops]).
template <std::size_t N>
loop_plan<N> make_plan(const shape_t& sizes, const std::array<const shape_t*, N>& strides) {
  loop_plan<N> p;
  p.numel = numel_of(sizes);
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    if (sizes[d] == 1) continue;
    if (!p.sizes.empty()) {
      bool merge = true;
      for (std::size_t k = 0; k < N; ++k)
        merge = merge && p.strides[k].back() == (*strides[k])[d] * sizes[d];
      if (merge) {
        p.sizes.back() *= sizes[d];
        for (std::size_t k = 0; k < N; ++k) p.strides[k].back() = (*strides[k])[d];
        continue;
      }
    }
    p.sizes.push_back(sizes[d]);
    for (std::size_t k = 0; k < N; ++k) p.strides[k].push_back((*strides[k])[d]);
  }
  if (p.sizes.empty()) {  // 0-d or all size-1: one row of one element
    p.sizes.push_back(1);
    for (auto& s : p.strides) s.push_back(1);
  }
  return p;
}

// Advances an N-d counter over dims [0, upto) of the plan, moving the operand pointers; returns
// false after the last position.
template <std::size_t N>
bool advance(const loop_plan<N>& p, std::int64_t* counter, std::size_t upto, std::array<char*, N>& ptr,
             const std::array<std::int64_t, N>& elsize) {
  for (std::size_t d = upto; d-- > 0;) {
    if (++counter[d] < p.sizes[d]) {
      for (std::size_t k = 0; k < N; ++k) ptr[k] += p.strides[k][d] * elsize[k];
      return true;
    }
    counter[d] = 0;
    for (std::size_t k = 0; k < N; ++k) ptr[k] -= (p.sizes[d] - 1) * p.strides[k][d] * elsize[k];
  }
  return false;
}

// True when some operand is unit-stride along the second-to-last dim but not along the last
// (a transposed operand): rows are then walked in tiles so its cache lines are reused.
template <std::size_t N>
bool wants_tiles(const loop_plan<N>& p) {
  const std::size_t nd = p.sizes.size();
  if (nd < 2 || p.sizes[nd - 1] < 32 || p.sizes[nd - 2] < 32) return false;
  for (std::size_t k = 0; k < N; ++k)
    if (p.strides[k][nd - 2] == 1 && p.strides[k][nd - 1] != 1) return true;
  return false;
}

/// Calls `row(ptrs, n, inner_strides)` for every innermost row of the plan; ptrs are char* to
/// the row's first element, inner strides are in elements. `elsize[k]` is operand k's size.
/// Rows may be handed over in pieces (tiles of 16 rows x 128 columns when an operand is
/// transposed), in an order that visits every element exactly once.
template <std::size_t N, class Row>
void for_each_row(const loop_plan<N>& p, std::array<char*, N> base, const std::array<std::int64_t, N>& elsize,
                  Row&& row) {
  if (p.numel == 0) return;
  const std::size_t nd = p.sizes.size();
  const std::int64_t n = p.sizes[nd - 1];
  std::array<std::int64_t, N> inner{};
  for (std::size_t k = 0; k < N; ++k) inner[k] = p.strides[k][nd - 1];
  std::array<std::int64_t, 8> idx{};  // outer counter; tensors have at most a few dims
  shape_t idx_big;
  std::int64_t* counter = idx.data();
  if (nd > idx.size()) { idx_big.assign(nd, 0); counter = idx_big.data(); }
  std::array<char*, N> ptr = base;
  if (!wants_tiles(p)) {
    do row(ptr, n, inner);
    while (advance(p, counter, nd - 1, ptr, elsize));
    return;
  }
  constexpr std::int64_t tile_rows = 16, tile_cols = 128;
  const std::int64_t rows = p.sizes[nd - 2];
  do {
    for (std::int64_t r0 = 0; r0 < rows; r0 += tile_rows)
      for (std::int64_t c0 = 0; c0 < n; c0 += tile_cols)
        for (std::int64_t r = r0; r < std::min(rows, r0 + tile_rows); ++r) {
          std::array<char*, N> at = ptr;
          for (std::size_t k = 0; k < N; ++k) at[k] += (r * p.strides[k][nd - 2] + c0 * inner[k]) * elsize[k];
          row(at, std::min(tile_cols, n - c0), inner);
        }
  } while (advance(p, counter, nd - 2, ptr, elsize));
}

/// Convenience: plan + walk over tensors of one shape.
template <std::size_t N, class Row>
void for_each_row(const std::array<const tensor*, N>& ts, Row&& row) {
  std::array<const shape_t*, N> st{};
  std::array<char*, N> base{};
  std::array<std::int64_t, N> es{};
  for (std::size_t k = 0; k < N; ++k) {
    st[k] = &ts[k]->strides();
    base[k] = static_cast<char*>(ts[k]->data_ptr());
    es[k] = static_cast<std::int64_t>(ts[k]->element_size());
  }
  for_each_row(make_plan<N>(ts[0]->sizes(), st), base, es, std::forward<Row>(row));
}

/// Walks an N-d index space calling f(index) for each index (row-major); for non-hot loops.
template <class F>
void for_each_index(const shape_t& sizes, F&& f) {
  if (numel_of(sizes) == 0) return;
  shape_t idx(sizes.size(), 0);
  while (true) {
    f(idx);
    std::size_t d = sizes.size();
    while (d > 0) {
      --d;
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (sizes.empty()) return;
  }
}

/// Element offset of `idx` under `strides`.
inline std::int64_t offset_of(const shape_t& idx, const shape_t& strides) {
  std::int64_t o = 0;
  for (std::size_t d = 0; d < idx.size(); ++d) o += idx[d] * strides[d];
  return o;
}

}  // namespace troupe::kernels::cpu::detail
