// CPU collectives over the TCP ring (Note [tcp ring]): pipelined chunked ring allreduce /
// broadcast / allgather / reduce_scatter and the barrier, on a tcp_transport.
#include <algorithm>
#include <cstring>

#include "reduce_kernels.hpp"
#include "tcp_transport.hpp"

namespace troupe::ddp::detail {

namespace {

std::byte* bytes_of(const tensor& t) { return static_cast<std::byte*>(t.data_ptr()); }

int wrap(int k, int w) { return ((k % w) + w) % w; }

/// Element range [lo, hi) of block k when n elements are split over w ranks.
std::size_t block_lo(std::size_t n, int w, int k) { return n * static_cast<std::size_t>(k) / static_cast<std::size_t>(w); }

/// Calls fn(offset, count) for the chunks of [lo, hi), `chunk` elements each.
template <class Fn>
void for_chunks(std::size_t lo, std::size_t hi, std::size_t chunk, Fn&& fn) {
  for (std::size_t off = lo; off < hi; off += chunk) fn(off, std::min(chunk, hi - off));
}

/// The element count of one chunk (at least one element).
std::size_t chunk_elems(const tcp_transport& tp, std::size_t es) { return std::max<std::size_t>(1, tp.chunk_bytes() / es); }

/// Folds the partial received from prev() with the local block. The fold is in rank order when
/// the partial holds only lower ranks, that is when the chain of that block started at `start`.
/// With 2 ranks this is exactly the shared-memory order.
void fold(dtype dt, reduce_op op, int divisor, const std::byte* partial, const std::byte* local, std::byte* out,
          std::size_t n, bool partial_first) {
  const std::byte* srcs[2] = {partial_first ? partial : local, partial_first ? local : partial};
  reduce_arrays(dt, op, divisor, srcs, 2, out, nullptr, n);
}

/// The op of the intermediate ring steps (avg divides only at the last one).
reduce_op partial_op(reduce_op op) { return op == reduce_op::avg ? reduce_op::sum : op; }

}  // namespace

void run_allreduce(tcp_transport& tp, std::uint32_t seq, const tensor& t, reduce_op op) {
  tp.enter(make_fp(seq, collective_kind::allreduce, op, &t, -1));
  move_allreduce(tp, seq, t, op);
}

void move_allreduce(tcp_transport& tp, std::uint32_t, const tensor& t, reduce_op op) {
  const int w = tp.world(), r = tp.rank();
  if (w == 1) return;
  const std::size_t es = t.element_size(), n = static_cast<std::size_t>(t.numel()), c = chunk_elems(tp, es);
  std::byte* base = bytes_of(t);
  std::vector<std::byte> buf(c * es);
  auto lo = [&](int k) { return block_lo(n, w, k); };
  // Reduce-scatter: block k starts at rank k and ends, fully reduced, at rank k-1.
  for_chunks(lo(r), lo(r + 1), c, [&](std::size_t off, std::size_t m) { tp.send_next(base + off * es, m * es); });
  for (int s = 0; s < w - 1; ++s) {
    const int k = wrap(r - s - 1, w);
    const bool last = s == w - 2;
    for_chunks(lo(k), lo(k + 1), c, [&](std::size_t off, std::size_t m) {
      tp.recv_prev(buf.data(), m * es);
      fold(t.dtype(), last ? op : partial_op(op), w, buf.data(), base + off * es, base + off * es, m, k < r);
      tp.send_next(base + off * es, m * es);  // the next step's input, or the allgather's first
    });
  }
  // Allgather: block r - s arrives at step s, forwarded except at the last step.
  for (int s = 0; s < w - 1; ++s) {
    const int k = wrap(r - s, w);
    for_chunks(lo(k), lo(k + 1), c, [&](std::size_t off, std::size_t m) {
      tp.recv_prev(base + off * es, m * es);
      if (s < w - 2) tp.send_next(base + off * es, m * es);
    });
  }
  tp.flush();
  if (n > 0) t.bump_version();
}

void run_broadcast(tcp_transport& tp, std::uint32_t seq, const tensor& t, int root) {
  tp.enter(make_fp(seq, collective_kind::broadcast, reduce_op::sum, &t, root));
  move_broadcast(tp, t, root);
}

void move_broadcast(tcp_transport& tp, const tensor& t, int root) {
  if (tp.world() == 1) return;
  const bool forward = tp.next() != root;
  for_chunks(0, t.nbytes(), tp.chunk_bytes(), [&](std::size_t off, std::size_t m) {
    if (tp.rank() != root) tp.recv_prev(bytes_of(t) + off, m);
    if (tp.rank() == root || forward) tp.send_next(bytes_of(t) + off, m);
  });
  tp.flush();
  if (t.nbytes() > 0 && tp.rank() != root) t.bump_version();
}

void run_allgather(tcp_transport& tp, std::uint32_t seq, const tensor& out, const tensor& in) {
  tp.enter(make_fp(seq, collective_kind::allgather, reduce_op::sum, &in, -1));
  move_allgather(tp, out, in);
}

void move_allgather(tcp_transport& tp, const tensor& out, const tensor& in) {
  const int w = tp.world(), r = tp.rank();
  const std::size_t nb = in.nbytes();
  if (nb > 0) std::memcpy(bytes_of(out) + static_cast<std::size_t>(r) * nb, bytes_of(in), nb);
  if (w > 1) {
    for_chunks(0, nb, tp.chunk_bytes(), [&](std::size_t off, std::size_t m) { tp.send_next(bytes_of(in) + off, m); });
    for (int s = 0; s < w - 1; ++s) {
      std::byte* block = bytes_of(out) + static_cast<std::size_t>(wrap(r - s - 1, w)) * nb;
      for_chunks(0, nb, tp.chunk_bytes(), [&](std::size_t off, std::size_t m) {
        tp.recv_prev(block + off, m);
        if (s < w - 2) tp.send_next(block + off, m);
      });
    }
    tp.flush();
  }
  if (out.numel() > 0) out.bump_version();
}

void run_reduce_scatter(tcp_transport& tp, std::uint32_t seq, const tensor& out, const tensor& in, reduce_op op) {
  tp.enter(make_fp(seq, collective_kind::reduce_scatter, op, &out, -1));
  const int w = tp.world(), r = tp.rank();
  const std::size_t es = out.element_size(), m = static_cast<std::size_t>(out.numel()), c = chunk_elems(tp, es);
  const std::byte* src = bytes_of(in);
  if (w == 1) {
    if (m > 0) reduce_arrays(out.dtype(), op, 1, &src, 1, bytes_of(out), nullptr, m);
  } else {
    // Block k starts at rank k+1 and ends at rank k; partials go through a scratch copy.
    std::vector<std::byte> scratch(in.nbytes()), buf(c * es);
    const std::size_t first = static_cast<std::size_t>(wrap(r - 1, w)) * m;
    for_chunks(0, m, c, [&](std::size_t off, std::size_t len) { tp.send_next(src + (first + off) * es, len * es); });
    for (int s = 0; s < w - 1; ++s) {
      const int k = wrap(r - s - 2, w);
      const bool last = s == w - 2;
      const std::size_t at = static_cast<std::size_t>(k) * m;
      for_chunks(0, m, c, [&](std::size_t off, std::size_t len) {
        tp.recv_prev(buf.data(), len * es);
        std::byte* dst = last ? bytes_of(out) + off * es : scratch.data() + (at + off) * es;
        fold(out.dtype(), last ? op : partial_op(op), w, buf.data(), src + (at + off) * es, dst, len, wrap(k + 1, w) < r);
        if (!last) tp.send_next(dst, len * es);
      });
    }
    tp.flush();
  }
  if (m > 0) out.bump_version();
}

void run_barrier(tcp_transport& tp, std::uint32_t seq) {
  tp.enter(make_fp(seq, collective_kind::barrier, reduce_op::sum, nullptr, -1));
  tp.flush();  // the forwarded fingerprints must leave before this rank may exit
}

void run_send(tcp_transport& tp, p2p_counters&, const tensor& t, int dst, int tag) {
  fingerprint meta;
  meta.dtype = static_cast<std::uint8_t>(t.dtype());
  meta.numel = t.numel();
  meta.root = tag;
  tp.p2p_send(dst, meta, bytes_of(t), t.nbytes());
}

void run_recv(tcp_transport& tp, p2p_counters&, const tensor& t, int src, int tag) {
  const fingerprint meta = tp.p2p_recv_meta(src);
  if (meta.dtype != static_cast<std::uint8_t>(t.dtype()) || meta.numel != t.numel() || meta.root != tag) {
    const auto sent = static_cast<troupe::dtype>(meta.dtype);
    tp.p2p_recv_data(src, nullptr, static_cast<std::size_t>(meta.numel) * troupe::element_size(sent));  // keep in step
    throw error(errc::collective_mismatch,
                "recv from rank " + std::to_string(src) + ": expected " + std::string(troupe::to_string(t.dtype())) +
                    " numel " + std::to_string(t.numel()) + " tag " + std::to_string(tag) + ", the sender sent " +
                    std::string(troupe::to_string(sent)) + " numel " + std::to_string(meta.numel) + " tag " +
                    std::to_string(meta.root));
  }
  tp.p2p_recv_data(src, bytes_of(t), t.nbytes());
  if (t.nbytes() > 0) t.bump_version();
}

}  // namespace troupe::ddp::detail
