#pragma once
// Where the bucket actors hand their launched reductions to the reducer (Note [bucket actor]).

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <vector>

#include "troupe/ddp/distributed_data_parallel.hpp"

namespace troupe::ddp::detail {

/// One round of launches: a slot per bucket, each filled once by its bucket actor with what its
/// comm hook started, and waited for by the backward thread. A promise per bucket, with one
/// condition variable for all. Thread-safe.
class launch_board {
 public:
  using clock = std::chrono::steady_clock;

  /// Starts a round of `buckets` empty slots; forgets the last round. Never blocks.
  void open(std::size_t buckets);
  /// Fills slot `bucket` with `result`, launched at `launched_at` (the bucket actor). Never blocks.
  void fill(int bucket, comm_result result, clock::time_point launched_at);
  /// Waits until at least `count` slots are filled, up to `timeout`. Returns every slot when they
  /// are, nullopt at the timeout. Blocks the calling thread.
  std::optional<std::vector<std::optional<comm_result>>> wait_filled(std::size_t count, std::chrono::milliseconds timeout);
  /// Every slot as it is now. Never blocks.
  std::vector<std::optional<comm_result>> slots() const;
  /// Slots filled in this round.
  std::size_t filled() const;
  /// Bucket indices in the order their slots were filled.
  std::vector<int> order() const;
  /// Per bucket: when its reduction was launched (default for an empty slot).
  std::vector<clock::time_point> launched_at() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::optional<comm_result>> slots_;
  std::vector<clock::time_point> launched_at_;
  std::vector<int> order_;
};

}  // namespace troupe::ddp::detail
