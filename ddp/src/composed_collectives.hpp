#pragma once
// reduce, gather, scatter and all_to_all over either CPU transport.
//
// Note [composed collectives]
// ---------------------------
// Each of these enters with its own fingerprint: kind, op, root, dtype and numel of the
// per-rank block. So ranks that disagree fail with collective_mismatch before any byte
// moves, exactly as the primitive collectives do. Then it runs the data movement of a
// primitive collective, which waits through the same transport calls:
//
//   reduce(t, root)       allreduce of t on root, of a copy of t elsewhere (t stays as it was)
//   gather(out, in, root) allgather of in into out on root, into scratch elsewhere
//   scatter(out, in, root) broadcast of root's in (scratch elsewhere); block `rank` -> out
//   all_to_all(out, in)   allgather of in into w*w blocks of scratch; block (j, rank) -> out[j]
//
// The cost is that of the primitive: gather, scatter and all_to_all move about w times the
// bytes a direct exchange would. They take one sequence number and one fingerprint each.

#include <cstring>

#include "shm_transport.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::ddp::detail {

/// Copies `count` elements of `src` from element `from` into `dst` at element `to`.
inline void copy_block(const tensor& dst, std::size_t to, const tensor& src, std::size_t from, std::size_t count) {
  const std::size_t es = dst.element_size();
  if (count == 0) return;
  std::memcpy(static_cast<std::byte*>(dst.data_ptr()) + to * es, static_cast<const std::byte*>(src.data_ptr()) + from * es,
              count * es);
}

template <class Transport>
void run_reduce(Transport& tp, std::uint32_t seq, const tensor& t, int root, reduce_op op) {
  tp.enter(make_fp(seq, collective_kind::reduce, op, &t, root));
  const tensor target = tp.rank() == root ? t : t.clone();
  move_allreduce(tp, seq, target, op);
}

template <class Transport>
void run_gather(Transport& tp, std::uint32_t seq, const tensor& out, const tensor& in, int root) {
  tp.enter(make_fp(seq, collective_kind::gather, reduce_op::sum, &in, root));
  const tensor target = tp.rank() == root ? out : empty({in.numel() * tp.world()}, {in.dtype()});
  move_allgather(tp, target, in);
}

template <class Transport>
void run_scatter(Transport& tp, std::uint32_t seq, const tensor& out, const tensor& in, int root) {
  tp.enter(make_fp(seq, collective_kind::scatter, reduce_op::sum, &out, root));
  const tensor source = tp.rank() == root ? in : empty({out.numel() * tp.world()}, {out.dtype()});
  move_broadcast(tp, source, root);
  const std::size_t n = static_cast<std::size_t>(out.numel());
  copy_block(out, 0, source, n * static_cast<std::size_t>(tp.rank()), n);
  if (n > 0) out.bump_version();
}

template <class Transport>
void run_all_to_all(Transport& tp, std::uint32_t seq, const tensor& out, const tensor& in) {
  tp.enter(make_fp(seq, collective_kind::all_to_all, reduce_op::sum, &in, -1));
  const auto w = static_cast<std::size_t>(tp.world()), r = static_cast<std::size_t>(tp.rank());
  const std::size_t n = static_cast<std::size_t>(in.numel()) / w;  // one block
  const tensor all = empty({in.numel() * tp.world()}, {in.dtype()});
  move_allgather(tp, all, in);
  for (std::size_t j = 0; j < w; ++j) copy_block(out, j * n, all, (j * w + r) * n, n);
  if (n > 0) out.bump_version();
}

}  // namespace troupe::ddp::detail
