#pragma once
// The bodies of the CPU collectives, run on the group's worker thread (Note [shm collectives]).

#include <vector>

#include "shm_transport.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe::ddp::detail {

void run_allreduce(shm_transport& tp, std::uint32_t seq, const tensor& t, reduce_op op);
void run_broadcast(shm_transport& tp, std::uint32_t seq, const tensor& t, int root);
void run_allgather(shm_transport& tp, std::uint32_t seq, const tensor& out, const tensor& in);
void run_reduce_scatter(shm_transport& tp, std::uint32_t seq, const tensor& out, const tensor& in, reduce_op op);
void run_barrier(shm_transport& tp, std::uint32_t seq);

// The data movement of allreduce, broadcast and allgather after the fingerprint exchange; the
// composed collectives (composed_collectives.hpp) enter with their own fingerprint, then call these.
void move_allreduce(shm_transport& tp, std::uint32_t seq, const tensor& t, reduce_op op);
void move_broadcast(shm_transport& tp, const tensor& t, int root);
void move_allgather(shm_transport& tp, const tensor& out, const tensor& in);

/// Point-to-point state: chunks sent to / received from each peer so far.
struct p2p_counters {
  std::vector<std::uint32_t> sent;
  std::vector<std::uint32_t> received;
};
void run_send(shm_transport& tp, p2p_counters& pc, const tensor& t, int dst, int tag);
void run_recv(shm_transport& tp, p2p_counters& pc, const tensor& t, int src, int tag);

}  // namespace troupe::ddp::detail
