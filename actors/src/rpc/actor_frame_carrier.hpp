#pragma once
// Remote actor frames on the direct channel (Note [remote actors] in remote/remote_actors.hpp).
// A message frame passes the transport hook as message_kind::actor_message, with the same
// decisions as a call: drop, copies, delay. Control frames (watch, down) pass no hook. Received
// frames go to the actor layer's sink; the channel knows nothing of actors.
//
//   remote_actors::forward --send--> hook.on_send --> frame_sender --> peer
//   peer --> reading thread --on_frame--> hook.on_receive --> sink (now, later, n times)
//
// The first actor frame on a connection, either way, makes the I/O thread poll it from then on.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "rpc/actor_frames.hpp"
#include "rpc/channel_conn.hpp"
#include "rpc/frame_sender.hpp"
#include "troupe/actors/transport.hpp"

namespace troupe::detail {

/// Carries actor frames between a channel's connections and the actor layer. Thread-safe.
class actor_frame_carrier {
 public:
  /// `me` names this node; `hook` may be null; `wake_io` makes the I/O thread list its
  /// connections again. `sender` outlives this.
  actor_frame_carrier(std::string me, std::shared_ptr<transport_hook> hook, frame_sender& sender, frame_sender::later_fn later,
                      std::function<void()> wake_io, std::uint32_t max_body);

  /// Where received frames go. Set before the first connection.
  void set_sink(std::weak_ptr<actor_frame_sink> sink) { sink_ = std::move(sink); }
  /// Sends `frame` on `c` (the contract of direct_channel::send_actor).
  void send(const std::shared_ptr<channel_conn>& c, std::vector<char> frame, bool control, std::string type);
  /// A frame body read from `c`, on the thread reading it.
  void on_frame(const std::shared_ptr<channel_conn>& c, bool control, const char* body, std::size_t n);
  /// `c` closed: the sink hears of it.
  void lost(const std::shared_ptr<channel_conn>& c, const std::string& why);

 private:
  void mark(channel_conn& c);

  std::string me_;
  std::shared_ptr<transport_hook> hook_;
  frame_sender& sender_;
  frame_sender::later_fn later_;
  std::function<void()> wake_io_;
  std::uint32_t max_body_;
  std::weak_ptr<actor_frame_sink> sink_;
};

}  // namespace troupe::detail
