#pragma once
// Node options shared by the multi-process benchmarks: loopback, a fixed job token, 30 s calls.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

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

/// A free TCP port on loopback, for rank 0 of a benchmark job (chosen before the fork: spawn must
/// precede any actor system; rank 0 binds it again right away).
inline std::uint16_t free_loopback_port() {
  const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::getsockname(probe, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(probe);
  return ntohs(addr.sin_port);
}

}  // namespace troupe::bench
