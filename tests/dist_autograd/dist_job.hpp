#pragma once
// An in-process job of N nodes (tests/fault/rref_cluster.hpp: one actor system each, loopback TCP
// between them, one switchable fault injector) with one dist_autograd container per node.

#include <cstddef>
#include <memory>
#include <vector>

#include "fault/rref_cluster.hpp"
#include "troupe/dist_autograd/container.hpp"

namespace troupe::test {

struct dist_job {
  cluster c;
  std::vector<std::unique_ptr<dist_autograd::container>> dist;

  explicit dist_job(int n, dist_autograd::container_options o = {}) : c(n) {
    for (auto& nd : c.nodes) dist.push_back(std::make_unique<dist_autograd::container>(*nd, o));
  }
  ~dist_job() { dist.clear(); }  // before the nodes go
  dist_job(const dist_job&) = delete;
  dist_job& operator=(const dist_job&) = delete;

  node& at(int i) { return *c.nodes[static_cast<std::size_t>(i)]; }
  dist_autograd::container& operator[](int i) { return *dist[static_cast<std::size_t>(i)]; }
  /// Live contexts on every worker together.
  std::size_t contexts() const {
    std::size_t n = 0;
    for (const auto& d : dist) n += d->num_contexts();
    return n;
  }
};

}  // namespace troupe::test
