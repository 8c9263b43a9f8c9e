#pragma once
/// \file work.hpp
/// The reduction operators and the handle of one asynchronous collective, shared by every
/// collective_group (CPU process groups and the NCCL group).

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "troupe/tensors/error.hpp"

namespace troupe::ddp {

/// Reduction applied by allreduce, reduce and reduce_scatter. `avg` divides the sum by the world size
/// (integer dtypes: truncating division). For bool, sum/max are "or", product/min are "and".
enum class reduce_op : std::uint8_t { sum = 0, avg = 1, min = 2, max = 3, product = 4 };

/// "sum", "avg", ...
const char* to_string(reduce_op op) noexcept;

/// The handle of one asynchronous collective of any collective_group. Copyable (copies share the
/// state); thread-safe.
class work {
 public:
  struct state;
  work() = default;
  explicit work(std::shared_ptr<state> s) : state_(std::move(s)) {}

  /// Blocks the calling thread until the collective finished or `timeout` passed. Throws the
  /// collective's error (peer_lost, collective_mismatch, timeout, bad_argument, ...), or
  /// errc::timeout naming the collective when it is still running at the deadline (it keeps
  /// running). Throws invalid_state for a default-constructed work.
  void wait(std::chrono::milliseconds timeout = std::chrono::seconds(60)) const;
  /// True once the collective finished (successfully or not). Never blocks.
  bool is_completed() const;
  /// The error the collective failed with; nullopt while running or after success.
  std::optional<troupe::error> error() const;
  /// False for a default-constructed work.
  bool valid() const noexcept { return state_ != nullptr; }
  /// What the collective was ("allreduce(sum) #12 float32[1024]"), for messages.
  std::string description() const;
  /// When the collective finished (steady clock); nullopt while it runs. Never blocks.
  std::optional<std::chrono::steady_clock::time_point> completed_at() const;
  /// Orders what the calling thread enqueues next after the collective. A device work (NCCL)
  /// makes the thread's current stream of the group's device wait on it; it never blocks the
  /// host. A CPU work is waited for (`wait()` with its default timeout). Throws as wait().
  void synchronize_stream() const;

 private:
  std::shared_ptr<state> state_;
};

}  // namespace troupe::ddp
