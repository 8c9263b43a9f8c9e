#pragma once
// Node options shared by the multi-process benchmarks: loopback, a fixed job token, 30 s calls.

#include <chrono>
#include <cstdint>

#include "troupe/actors/node_options.hpp"

namespace troupe::bench {

/// Options of rank `rank` of a `world`-rank benchmark job whose rank 0 listens on `master_port`.
inline node_options bench_node_options(int rank, int world, std::uint16_t master_port) {
  node_options o;
  o.rank = rank;
  o.world_size = world;
  o.master_port = master_port;
  o.job_token = "bench";
  o.default_timeout = std::chrono::seconds(30);
  return o;
}

}  // namespace troupe::bench
