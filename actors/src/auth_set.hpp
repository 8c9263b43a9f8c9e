#pragma once
// The set of CAF nodes that presented the job token (Note [job token]); shared by a node's
// agent and store. Thread-safe.

#include <mutex>
#include <set>

#include <caf/node_id.hpp>

namespace troupe::detail {

class auth_set {
 public:
  void add(const caf::node_id& n) {
    std::lock_guard<std::mutex> lock(mutex_);
    nodes_.insert(n);
  }
  bool contains(const caf::node_id& n) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return nodes_.count(n) > 0;
  }

 private:
  mutable std::mutex mutex_;
  std::set<caf::node_id> nodes_;
};

}  // namespace troupe::detail
