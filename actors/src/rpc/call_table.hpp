#pragma once
// The pending calls of one node's direct channel and their deadlines (Note [direct channel] in
// rpc/direct_channel.hpp).
//
// Every call the node sends is entered here before its request is written. It leaves exactly
// once, through finish() or close(): a response, its deadline, the loss of its connection, or
// stop(). finish() completes its state and pokes the caller that reads the connection, unless
// that caller is the finishing thread itself. The table also counts, per connection, the calls
// pending on it and those nobody waits on. Those counts decide who reads an outgoing connection:
// its waiting caller, or the I/O thread.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "troupe/actors/rpc/future.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::detail {

class bulk_names;
class channel_conn;

/// The pending-call table and its deadline order. Thread-safe: one lock guards the table and the
/// counters of every connection (channel_conn::pending_calls, unattended, handed_over).
class call_table {
 public:
  using clock = std::chrono::steady_clock;
  /// A call past its deadline: its connection, its id, and what it is (for the error message).
  struct expired_call {
    const channel_conn* conn;
    std::uint64_t id;
    std::string what;
  };
  /// A call left when the table closed.
  using left_calls = std::vector<std::shared_ptr<rpc::detail::call_state>>;

  /// `bulk` (may be null) takes back large response payloads (Note [byte pool]).
  explicit call_table(std::shared_ptr<bulk_names> bulk) : bulk_(std::move(bulk)) {}

  /// Enters a call to `function` on `c` with `st`'s deadline, and makes `c`'s waiter its helper
  /// (nobody can wait on it before). Returns its id; 0 once the table is closed.
  std::uint64_t add(const std::shared_ptr<channel_conn>& c, const std::shared_ptr<rpc::detail::call_state>& st,
                    const std::string& function);
  /// Completes call `id` if it is pending on `c`: a response answers only its own connection's
  /// calls. Does nothing when it is not (late, duplicated, elsewhere).
  void finish(const channel_conn* c, std::uint64_t id, errc code, std::string msg, std::vector<char> payload, std::vector<char> meta);
  /// Fails every call pending on `c` with peer_lost: `peer` was lost for `why`; `me` names this
  /// node.
  void fail_on(const channel_conn* c, const std::string& peer, const std::string& why, const std::string& me);
  /// Fills `out` with the calls whose deadline is `now` or earlier, earliest first.
  void expired(clock::time_point now, std::vector<expired_call>& out);
  /// The earliest deadline, or `bound` when that is earlier or nothing is pending.
  clock::time_point next_deadline(clock::time_point bound);

  /// Nobody waits for call `id` on `c` from now on. True when it is the first such call on `c`
  /// (the I/O thread must start reading `c`).
  bool unattend(const channel_conn* c, std::uint64_t id);
  /// Whether `c`'s pending calls need the I/O thread to read it: some are unattended, or a
  /// caller that stopped reading left some behind.
  bool needs_io(const channel_conn& c);
  /// A waiting caller stops reading `c`. True when calls are left on it (handed to the I/O
  /// thread).
  bool hand_over(const channel_conn& c);
  /// Whether calls are pending on `c`.
  bool has_calls(const channel_conn& c);
  /// Closes the table (add() returns 0 from now on) and returns the calls left.
  left_calls close();

 private:
  struct entry {
    std::shared_ptr<rpc::detail::call_state> state;
    const channel_conn* conn;
    std::string function;
    std::multimap<clock::time_point, std::uint64_t>::iterator deadline;
    bool unattended = false;  ///< the I/O thread reads its response (nobody waits on it)
  };

  std::shared_ptr<bulk_names> bulk_;
  std::mutex mutex_;
  bool closed_ = false;
  std::uint64_t next_id_ = 1;
  std::unordered_map<std::uint64_t, entry> calls_;
  std::multimap<clock::time_point, std::uint64_t> deadlines_;
};

}  // namespace troupe::detail
