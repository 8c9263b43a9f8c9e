#pragma once
// The callee side of the direct channel (Note [direct channel] in rpc/direct_channel.hpp).
// A request passes the transport hook and becomes one executor job per copy. Its response goes
// back on the connection it came from.
//
//   request --hook.on_receive--> drop | delay (timer queue) | copies
//           --> job: quick (the leader runs it first) or not (a follower may)
//           --> serve_adopting (rpc/serve.hpp) --> respond --hook.on_send--> frame_sender
//
// An unknown function, or an executor that is shutting down, is answered with an error at once.
// A result too large for one message is answered with remote_exception naming its size.

#include <chrono>
#include <functional>
#include <memory>

#include "executor.hpp"
#include "rpc/channel_config.hpp"
#include "rpc/channel_conn.hpp"
#include "rpc/frame_sender.hpp"
#include "troupe/actors/messages.hpp"

namespace troupe::detail {

/// Serves the requests read from a channel's incoming connections. Thread-safe.
class call_server {
 public:
  using clock = std::chrono::steady_clock;
  /// `sender` writes the responses; `later` runs requests the hook delayed. Both outlive this.
  call_server(direct_channel_config cfg, frame_sender& sender, frame_sender::later_fn later);
  /// Jobs keep `owner` (the channel) alive while they run. Set before the first request.
  void set_owner(std::weak_ptr<const void> owner) { owner_ = std::move(owner); }

  /// A request read from `c`. `jobs`: the leader's list (led_jobs), or null: posted to the
  /// executor.
  void on_request(const std::shared_ptr<channel_conn>& c, rpc_request req, led_jobs* jobs);
  /// Sends `resp` on `c` (through the hook), or holds it in `batch` (Note [reply batch]).
  /// `borrowed`: tensor bytes that belong in its payload (Note [borrowed tensor bytes]).
  void respond(const std::shared_ptr<channel_conn>& c, rpc_response resp, rpc::reply_batch* batch = nullptr,
               rpc::detail::borrowed_parts borrowed = {});

 private:
  void serve(const std::shared_ptr<channel_conn>& c, rpc_request req, int copies, led_jobs* jobs);

  direct_channel_config cfg_;
  frame_sender& sender_;
  frame_sender::later_fn later_;
  std::weak_ptr<const void> owner_;
};

}  // namespace troupe::detail
