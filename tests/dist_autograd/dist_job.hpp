#pragma once
// In-process jobs of N nodes with one dist_autograd container per node.
// - dist_job builds on the RRef tests' cluster (tests/fault/rref_cluster.hpp): one actor system
//   each, loopback TCP between them, one switchable fault injector.
// - small_job has nodes with a chosen number of executor threads and no fault hook. It serves
//   the tests of nested chains on a small executor.

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "dist_options.hpp"
#include "fault/rref_cluster.hpp"
#include "troupe/dist_autograd/container.hpp"

namespace troupe::test {

struct dist_job {
  cluster c;
  std::vector<std::unique_ptr<dist_autograd::container>> dist;

  explicit dist_job(int n, dist_autograd::container_options o = {}) : c(n, {}, dist_autograd::add_message_types) {
    for (auto& nd : c.nodes) dist.push_back(std::make_unique<dist_autograd::container>(*nd, o));
  }
  ~dist_job() { dist.clear(); }  // before the nodes go
  dist_job(const dist_job&) = delete;
  dist_job& operator=(const dist_job&) = delete;

  node& at(int i) { return *c.nodes[static_cast<std::size_t>(i)]; }
  dist_autograd::container& operator[](int i) { return *dist[static_cast<std::size_t>(i)]; }
  /// Live contexts on every worker together, once the releases of ended contexts were answered.
  std::size_t contexts() const {
    for (const auto& d : dist) d->await_releases(std::chrono::seconds(10));
    std::size_t n = 0;
    for (const auto& d : dist) n += d->num_contexts();
    return n;
  }
};

/// N nodes worker0..worker{N-1} with `executor_threads` each and one container each.
struct small_job {
  std::vector<std::unique_ptr<node>> nodes;
  std::vector<std::unique_ptr<dist_autograd::container>> dist;

  small_job(int n, int executor_threads, dist_autograd::container_options o = {}) {
    for (int r = 0; r < n; ++r) {
      auto opt = dist_options(r, n, r == 0 ? 0 : nodes[0]->port(), "dist-small");
      opt.executor_threads = executor_threads;
      nodes.push_back(std::make_unique<node>(opt));
    }
    for (auto& nd : nodes) dist.push_back(std::make_unique<dist_autograd::container>(*nd, o));
  }
  ~small_job() {
    dist.clear();  // before the nodes go
    for (auto& nd : nodes) nd->shutdown(shutdown_mode::immediate);
  }
  small_job(const small_job&) = delete;
  small_job& operator=(const small_job&) = delete;

  node& at(int i) { return *nodes[static_cast<std::size_t>(i)]; }
  dist_autograd::container& operator[](int i) { return *dist[static_cast<std::size_t>(i)]; }
  std::size_t contexts() const {
    for (const auto& d : dist) d->await_releases(std::chrono::seconds(10));
    std::size_t n = 0;
    for (const auto& d : dist) n += d->num_contexts();
    return n;
  }
};

}  // namespace troupe::test
