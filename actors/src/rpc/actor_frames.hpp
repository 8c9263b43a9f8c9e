#pragma once
// What the direct channel hands remote actor frames to (Note [remote actors] in
// remote/remote_actors.hpp). The channel knows nothing of actors: it carries opaque frames.

#include <memory>
#include <string>
#include <vector>

namespace troupe::detail {

class channel_conn;

/// Receives the actor frames of a node's direct channel. Thread-safe; must not block.
class actor_frame_sink {
 public:
  virtual ~actor_frame_sink() = default;
  /// One frame body from `c`'s peer, on the thread reading `c`. `control`: a control frame
  /// (frame_kind::actor_control), otherwise a message (frame_kind::actor).
  virtual void on_actor_frame(const std::shared_ptr<channel_conn>& c, bool control, const char* body, std::size_t n) = 0;
  /// `c` closed (EOF, a read or write error, a malformed frame, the peer's node went down).
  virtual void on_conn_lost(const std::shared_ptr<channel_conn>& c, const std::string& why) = 0;
};

}  // namespace troupe::detail
