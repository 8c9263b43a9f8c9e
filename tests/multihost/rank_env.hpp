#pragma once
// The rank side of the multi-host jobs: a node from the launcher environment, this host's name,
// and the end of a rank. At its end every rank reaches the same barrier, then shuts down.

#include <unistd.h>

#include <chrono>
#include <string>

#include "troupe/actors/node.hpp"

namespace troupe::test {

inline std::string this_host() {
  char buf[256] = {};
  ::gethostname(buf, sizeof buf - 1);
  return buf;
}

/// Worker names of a 2-host x 2-rank job: worker0, worker1 on host 0; worker2, worker3 on host 1.
inline std::string worker(int rank) { return "worker" + std::to_string(rank); }
inline int host_of(int rank) { return rank / 2; }

/// Node options from the launcher environment with short deadlines for tests.
inline node_options rank_options() {
  auto o = node_options::from_env();
  o.default_timeout = std::chrono::seconds(10);
  o.join_timeout = std::chrono::seconds(20);
  return o;
}

/// Every rank meets at `key`, then the node goes.
inline void finish_rank(node& n, const std::string& key = "finished") {
  n.store().barrier(key, n.info().rank, n.info().world_size, std::chrono::seconds(30));
  n.shutdown(shutdown_mode::graceful, std::chrono::seconds(10));
}

}  // namespace troupe::test
