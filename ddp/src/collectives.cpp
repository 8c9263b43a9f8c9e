// CPU collectives over the shared-memory transport. Every function follows the chunk protocol
// of Note [shm collectives]. Each chunk g ends with in_cnt = red_cnt = out_cnt = g+1 on every
// rank, whatever the collective. So the counters stay aligned across collectives.
#include "collectives.hpp"

#include <algorithm>
#include <cstring>

#include "reduce_kernels.hpp"

namespace troupe::ddp::detail {

namespace {

std::byte* bytes_of(const tensor& t) { return static_cast<std::byte*>(t.data_ptr()); }

/// Begins chunk g: waits until every rank consumed chunk g-2 (the slot is free again).
std::uint32_t begin_chunk(shm_transport& tp) {
  const std::uint32_t g = tp.chunk_counter()++;
  tp.wait_all(out_cnt, g - 1);
  return g;
}

/// Shard k of a chunk of m elements split over w ranks: [lo, hi).
std::size_t shard_lo(std::size_t m, int w, int k) { return m * static_cast<std::size_t>(k) / static_cast<std::size_t>(w); }

/// Shard k of n elements over w ranks, its bounds rounded to 64-byte lines: [lo, hi).
std::size_t line_shard_lo(std::size_t n, int w, int k, std::size_t es) {
  if (k >= w) return n;
  const std::size_t per_line = std::max<std::size_t>(1, 64 / es);
  return std::min(n, shard_lo(n, w, k) / per_line * per_line);
}

/// Elements per piece of the in-place pipeline (Note [shm zero copy]).
constexpr std::size_t piece_bytes = std::size_t{256} << 10;

/// Allreduce in place over every rank's arena tensor (Note [shm zero copy]).
void allreduce_in_place(shm_transport& tp, std::uint32_t seq, const tensor& t, reduce_op op) {
  const int w = tp.world(), r = tp.rank();
  const std::size_t es = t.element_size(), n = static_cast<std::size_t>(t.numel());
  std::vector<std::byte*> data(static_cast<std::size_t>(w));
  for (int k = 0; k < w; ++k) data[k] = k == r ? bytes_of(t) : tp.peer_data(k, seq);
  std::size_t longest = 0;
  for (int k = 0; k < w; ++k) longest = std::max(longest, line_shard_lo(n, w, k + 1, es) - line_shard_lo(n, w, k, es));
  const std::size_t piece = piece_bytes / es;
  const std::uint32_t pieces = static_cast<std::uint32_t>((longest + piece - 1) / piece);
  const std::uint32_t g0 = tp.chunk_counter();
  tp.chunk_counter() += pieces;
  std::vector<const std::byte*> srcs(static_cast<std::size_t>(w));
  const std::size_t lo = line_shard_lo(n, w, r, es), hi = line_shard_lo(n, w, r + 1, es);
  for (std::uint32_t j = 0; j < pieces; ++j) {  // fold my shard, piece by piece
    const std::size_t a = std::min(hi, lo + j * piece), b = std::min(hi, a + piece);
    for (int k = 0; k < w; ++k) srcs[k] = data[k] + a * es;
    if (b > a) reduce_arrays(t.dtype(), op, w, srcs.data(), w, data[r] + a * es, nullptr, b - a);
    tp.publish(in_cnt, g0 + j + 1);
    tp.publish(red_cnt, g0 + j + 1);
  }
  for (std::uint32_t j = 0; j < pieces; ++j) {  // copy the peers' folded pieces
    for (int k = 0; k < w; ++k) {
      if (k == r) continue;
      const std::size_t klo = line_shard_lo(n, w, k, es), khi = line_shard_lo(n, w, k + 1, es);
      const std::size_t a = std::min(khi, klo + j * piece), b = std::min(khi, a + piece);
      if (b == a) continue;
      tp.wait_ge(k, tp.ctl(k).counters[red_cnt].v, g0 + j + 1);
      std::memcpy(data[r] + a * es, data[k] + a * es, (b - a) * es);
    }
    tp.publish(out_cnt, g0 + j + 1);
  }
  if (pieces > 0) tp.wait_all(out_cnt, g0 + pieces);  // nobody reads my tensor any more
  if (n > 0) t.bump_version();
}

}  // namespace

void run_allreduce(shm_transport& tp, std::uint32_t seq, const tensor& t, reduce_op op) {
  const std::uint64_t off = tp.arena() ? tp.arena()->offset_of(t.data_ptr(), t.nbytes()) : 0;
  tp.enter(make_fp(seq, collective_kind::allreduce, op, &t, -1), off);
  move_allreduce(tp, seq, t, op);
}

void move_allreduce(shm_transport& tp, std::uint32_t seq, const tensor& t, reduce_op op) {
  bool in_place = t.numel() > 0;
  for (int k = 0; k < tp.world() && in_place; ++k) in_place = tp.peer_data(k, seq) != nullptr;
  if (in_place) return allreduce_in_place(tp, seq, t, op);
  const int w = tp.world(), r = tp.rank();
  const std::size_t es = t.element_size(), n = static_cast<std::size_t>(t.numel());
  const std::size_t chunk = tp.slot_bytes() / es;
  std::vector<const std::byte*> srcs(static_cast<std::size_t>(w));
  for (std::size_t off = 0; off < n; off += chunk) {
    const std::size_t m = std::min(chunk, n - off);
    std::byte* base = bytes_of(t) + off * es;
    const std::uint32_t g = begin_chunk(tp);
    for (int k = 0; k < w; ++k) {  // stage the shards the peers reduce
      if (k == r) continue;
      const std::size_t lo = shard_lo(m, w, k), hi = shard_lo(m, w, k + 1);
      std::memcpy(tp.slot(r, g) + lo * es, base + lo * es, (hi - lo) * es);
    }
    tp.publish(in_cnt, g + 1);
    tp.wait_all(in_cnt, g + 1);
    const std::size_t lo = shard_lo(m, w, r), hi = shard_lo(m, w, r + 1);
    for (int k = 0; k < w; ++k) srcs[k] = (k == r ? base : tp.slot(k, g)) + lo * es;
    reduce_arrays(t.dtype(), op, w, srcs.data(), w, base + lo * es, tp.slot(r, g) + lo * es, hi - lo);
    tp.publish(red_cnt, g + 1);
    for (int k = 0; k < w; ++k) {  // gather the shards the peers reduced
      if (k == r) continue;
      tp.wait_ge(k, tp.ctl(k).counters[red_cnt].v, g + 1);
      const std::size_t klo = shard_lo(m, w, k), khi = shard_lo(m, w, k + 1);
      std::memcpy(base + klo * es, tp.slot(k, g) + klo * es, (khi - klo) * es);
    }
    tp.publish(out_cnt, g + 1);
  }
  if (n > 0) t.bump_version();
}

void run_broadcast(shm_transport& tp, std::uint32_t seq, const tensor& t, int root) {
  tp.enter(make_fp(seq, collective_kind::broadcast, reduce_op::sum, &t, root));
  move_broadcast(tp, t, root);
}

void move_broadcast(shm_transport& tp, const tensor& t, int root) {
  const std::size_t nbytes = t.nbytes();
  const std::size_t chunk = tp.slot_bytes();
  for (std::size_t off = 0; off < nbytes; off += chunk) {
    const std::size_t m = std::min(chunk, nbytes - off);
    const std::uint32_t g = begin_chunk(tp);
    if (tp.rank() == root) {
      std::memcpy(tp.slot(root, g), bytes_of(t) + off, m);
      tp.publish(in_cnt, g + 1);
      tp.publish(red_cnt, g + 1);
    } else {
      tp.publish(in_cnt, g + 1);
      tp.publish(red_cnt, g + 1);
      tp.wait_ge(root, tp.ctl(root).counters[in_cnt].v, g + 1);
      std::memcpy(bytes_of(t) + off, tp.slot(root, g), m);
    }
    tp.publish(out_cnt, g + 1);
  }
  if (nbytes > 0 && tp.rank() != root) t.bump_version();
}

void run_allgather(shm_transport& tp, std::uint32_t seq, const tensor& out, const tensor& in) {
  tp.enter(make_fp(seq, collective_kind::allgather, reduce_op::sum, &in, -1));
  move_allgather(tp, out, in);
}

void move_allgather(shm_transport& tp, const tensor& out, const tensor& in) {
  const int w = tp.world(), r = tp.rank();
  const std::size_t nbytes = in.nbytes(), chunk = tp.slot_bytes();
  for (std::size_t off = 0; off < nbytes; off += chunk) {
    const std::size_t m = std::min(chunk, nbytes - off);
    const std::uint32_t g = begin_chunk(tp);
    std::memcpy(tp.slot(r, g), bytes_of(in) + off, m);
    std::memcpy(bytes_of(out) + static_cast<std::size_t>(r) * nbytes + off, bytes_of(in) + off, m);
    tp.publish(in_cnt, g + 1);
    tp.publish(red_cnt, g + 1);
    for (int k = 0; k < w; ++k) {
      if (k == r) continue;
      tp.wait_ge(k, tp.ctl(k).counters[in_cnt].v, g + 1);
      std::memcpy(bytes_of(out) + static_cast<std::size_t>(k) * nbytes + off, tp.slot(k, g), m);
    }
    tp.publish(out_cnt, g + 1);
  }
  if (out.numel() > 0) out.bump_version();
}

void run_reduce_scatter(shm_transport& tp, std::uint32_t seq, const tensor& out, const tensor& in, reduce_op op) {
  tp.enter(make_fp(seq, collective_kind::reduce_scatter, op, &out, -1));
  const int w = tp.world(), r = tp.rank();
  const std::size_t es = out.element_size(), m = static_cast<std::size_t>(out.numel());
  const std::size_t chunk = tp.slot_bytes() / es / static_cast<std::size_t>(w);
  std::vector<const std::byte*> srcs(static_cast<std::size_t>(w));
  const std::byte* src = bytes_of(in);
  for (std::size_t off = 0; off < m; off += chunk) {
    const std::size_t len = std::min(chunk, m - off);
    const std::uint32_t g = begin_chunk(tp);
    for (int k = 0; k < w; ++k)
      if (k != r)
        std::memcpy(tp.slot(r, g) + static_cast<std::size_t>(k) * chunk * es, src + (k * m + off) * es, len * es);
    tp.publish(in_cnt, g + 1);
    tp.wait_all(in_cnt, g + 1);
    for (int k = 0; k < w; ++k)
      srcs[k] = k == r ? src + (r * m + off) * es : tp.slot(k, g) + static_cast<std::size_t>(r) * chunk * es;
    reduce_arrays(out.dtype(), op, w, srcs.data(), w, bytes_of(out) + off * es, nullptr, len);
    tp.publish(red_cnt, g + 1);
    tp.publish(out_cnt, g + 1);
  }
  if (m > 0) out.bump_version();
}

void run_barrier(shm_transport& tp, std::uint32_t seq) {
  tp.enter(make_fp(seq, collective_kind::barrier, reduce_op::sum, nullptr, -1));
}

void run_send(shm_transport& tp, p2p_counters& pc, const tensor& t, int dst, int tag) {
  const int r = tp.rank();
  const std::size_t nbytes = t.nbytes(), box = tp.p2p_bytes();
  const std::size_t chunks = std::max<std::size_t>(1, (nbytes + box - 1) / box);
  auto& mine = tp.ctl(r);
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::uint32_t j = pc.sent[dst]++;
    tp.wait_ge(dst, tp.ctl(dst).p2p_ack[r].v, j, lane::sends);  // the mailbox is free once chunk j-1 was taken
    fingerprint& meta = mine.p2p_meta[dst];
    meta.dtype = static_cast<std::uint8_t>(t.dtype());
    meta.numel = t.numel();
    meta.root = tag;
    const std::size_t off = c * box, len = std::min(box, nbytes - std::min(nbytes, off));
    if (len > 0) std::memcpy(tp.mailbox(r, dst), bytes_of(t) + off, len);
    tp.publish(mine.p2p_sent[dst].v, j + 1);
  }
}

void run_recv(shm_transport& tp, p2p_counters& pc, const tensor& t, int src, int tag) {
  const int r = tp.rank();
  const std::size_t nbytes = t.nbytes(), box = tp.p2p_bytes();
  const std::size_t chunks = std::max<std::size_t>(1, (nbytes + box - 1) / box);
  for (std::size_t c = 0; c < chunks; ++c) {
    const std::uint32_t j = pc.received[src]++;
    tp.wait_ge(src, tp.ctl(src).p2p_sent[r].v, j + 1, lane::receives);
    const fingerprint meta = tp.ctl(src).p2p_meta[r];
    if (meta.dtype != static_cast<std::uint8_t>(t.dtype()) || meta.numel != t.numel() || meta.root != tag) {
      tp.publish(tp.ctl(r).p2p_ack[src].v, j + 1);  // release the sender's mailbox
      throw error(errc::collective_mismatch,
                  "recv from rank " + std::to_string(src) + ": expected " +
                      std::string(troupe::to_string(t.dtype())) + " numel " + std::to_string(t.numel()) + " tag " +
                      std::to_string(tag) + ", the sender sent " +
                      std::string(troupe::to_string(static_cast<troupe::dtype>(meta.dtype))) + " numel " +
                      std::to_string(meta.numel) + " tag " + std::to_string(meta.root));
    }
    const std::size_t off = c * box, len = std::min(box, nbytes - std::min(nbytes, off));
    if (len > 0) std::memcpy(bytes_of(t) + off, tp.mailbox(src, r), len);
    tp.publish(tp.ctl(r).p2p_ack[src].v, j + 1);
  }
  if (nbytes > 0) t.bump_version();
}

}  // namespace troupe::ddp::detail
