#pragma once
// The hang reports of this node's slow calls, by the number its flight recorder gave the call
// (Note [rpc blame] in rpc_watch.hpp). The watch writes them; a call that times out appends its
// report to its error. Keeps the newest `capacity` reports.

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace troupe::rpc::detail {

class blame_board {
 public:
  static constexpr std::size_t capacity = 256;

  /// Sets (or replaces) the report of call `seq`.
  void put(std::uint64_t seq, std::string report) {
    std::lock_guard<std::mutex> lock(mu_);
    reports_[seq] = std::move(report);
    while (reports_.size() > capacity) reports_.erase(reports_.begin());
  }
  /// The report of call `seq`; empty when none was made.
  std::string get(std::uint64_t seq) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = reports_.find(seq);
    return it == reports_.end() ? std::string() : it->second;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::uint64_t, std::string> reports_;
};

}  // namespace troupe::rpc::detail
