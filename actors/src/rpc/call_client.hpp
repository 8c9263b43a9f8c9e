#pragma once
// The caller side of the direct channel (Note [direct channel] in rpc/direct_channel.hpp).
// A call is entered in the call table, passes the transport hook and is written by the calling
// thread. Its response passes the hook on the reading thread and completes it.
//
//   call --table.add--> hook.on_send --> frame_sender (small: scratch buffer; large: split)
//   response --hook.on_receive--> drop | delay (timer queue) | table.finish
//
// A call on a closed connection fails at once with peer_lost. Arguments too large for one
// message fail with bad_argument naming their size. Nothing is sent after stop().

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "rpc/call_table.hpp"
#include "rpc/channel_config.hpp"
#include "rpc/channel_conn.hpp"
#include "rpc/frame_sender.hpp"
#include "troupe/actors/messages.hpp"

namespace troupe::detail {

/// Sends calls and completes them from their responses. Thread-safe.
class call_client {
 public:
  using clock = std::chrono::steady_clock;
  /// `sender` writes the requests; `later` runs responses the hook delayed. `wake_fd`: the I/O
  /// thread's eventfd, poked when a deadline comes before `io_sleep` from now.
  call_client(direct_channel_config cfg, frame_sender& sender, frame_sender::later_fn later, int wake_fd, std::chrono::milliseconds io_sleep);
  /// Delayed responses keep `owner` (the channel) alive. Set before the first call.
  void set_owner(std::weak_ptr<const void> owner) { owner_ = std::move(owner); }
  /// The pending calls.
  call_table& table() { return table_; }

  /// Sends one call over `c` (the calling thread writes it). Errors complete `st`. `stopping`:
  /// the channel stops; the call fails with invalid_state. `borrowed`: tensor bytes that belong
  /// in `payload` (Note [borrowed tensor bytes]); the call returns once they are written.
  void call(const std::shared_ptr<channel_conn>& c, const std::shared_ptr<rpc::detail::call_state>& st, const std::string& function,
            std::vector<char> payload, std::vector<char> meta, bool stopping, rpc::detail::borrowed_parts borrowed = {});
  /// A response read from `c`.
  void on_response(const std::shared_ptr<channel_conn>& c, rpc_response resp);

 private:
  void wake_if_first_deadline(clock::time_point deadline);

  direct_channel_config cfg_;
  call_table table_;
  frame_sender& sender_;
  frame_sender::later_fn later_;
  int wake_fd_;
  std::chrono::milliseconds io_sleep_;
  std::weak_ptr<const void> owner_;
};

}  // namespace troupe::detail
