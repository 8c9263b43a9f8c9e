#pragma once
// Private: the iteration machinery shared by the CPU kernels (tensors/src/cpu/*.cpp).
//
// Note [CPU loops]
// ----------------
// Every elementwise kernel sees N operands of one shape with arbitrary strides (0-strides from
// expand included). `make_plan` drops size-1 dims and coalesces adjacent dims that are
// contiguous with each other in *every* operand, so a contiguous (or contiguous-after-expand)
// tensor becomes one long row. `for_each_row` then walks the outer dims with a small N-d index
// counter and hands each innermost row (pointers, length, inner strides) to the kernel, which
// takes a fast path when all inner strides are 1 (plain `for (i..n) o[i] = f(a[i], b[i])` loops
// over __restrict pointers that GCC auto-vectorises at -O3) and a strided loop otherwise.
//
//      sizes [2,3,4] strides {12,4,1}  ->  sizes [24] strides {1}      (one row of 24)
//      sizes [2,3,4] out {12,4,1} b {0,4,1} -> sizes [2,12] out {12,1} b {0,1}

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

/// Calls `row(ptrs, n, inner_strides)` for every innermost row of the plan; ptrs are char* to
/// the row's first element, inner strides are in elements. `elsize[k]` is operand k's size.
template <std::size_t N, class Row>
void for_each_row(const loop_plan<N>& p, std::array<char*, N> base, const std::array<std::int64_t, N>& elsize,
                  Row&& row) {
  if (p.numel == 0) return;
  const std::size_t nd = p.sizes.size();
  const std::int64_t n = p.sizes[nd - 1];
  std::array<std::int64_t, N> inner{};
  for (std::size_t k = 0; k < N; ++k) inner[k] = p.strides[k][nd - 1];
  std::int64_t outer = p.numel / n;
  std::array<std::int64_t, 8> idx{};  // outer counter; tensors have at most a few dims
  shape_t idx_big;
  std::int64_t* counter = idx.data();
  if (nd > idx.size()) { idx_big.assign(nd, 0); counter = idx_big.data(); }
  std::array<char*, N> ptr = base;
  while (outer-- > 0) {
    row(ptr, n, inner);
    // advance the outer counter (dims nd-2 .. 0), carrying
    for (std::size_t d = nd - 1; d-- > 0;) {
      if (++counter[d] < p.sizes[d]) {
        for (std::size_t k = 0; k < N; ++k) ptr[k] += p.strides[k][d] * elsize[k];
        break;
      }
      counter[d] = 0;
      for (std::size_t k = 0; k < N; ++k) ptr[k] -= (p.sizes[d] - 1) * p.strides[k][d] * elsize[k];
    }
  }
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
