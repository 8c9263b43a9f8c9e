#pragma once
// The frames a direct channel connection delivers, read and routed (Note [direct channel] in
// rpc/direct_channel.hpp).
//
// Note [frame routing]
//
// Whoever holds a connection's reading role (the I/O thread, the executor's leader, a waiting
// caller) reads it through frame_reader::read. One read takes what the socket has, up to one
// round's budget (max_read_bytes, Note [fragments]), and handles every whole frame in order:
//   auth          an incoming connection's first frame: a valid ticket admits it, else dropped
//   request       incoming only: to call_server (an executor job, or the leader's list)
//   response      outgoing only: to call_client (completes its call)
//   actor, actor_control   either way, once authenticated: to actor_frame_carrier
//   fragment      put together into its inner frame, then handled as that frame
// Before its ticket, an incoming connection is read one auth frame's worth, and a header that
// announces more, or another kind, drops it at once. A frame larger than max_body() drops the
// connection before anything is allocated. Anything malformed drops the connection, says so on
// stderr and fails its calls (peer_lost); the node keeps serving the others.
//   bytes --read_available--> c->in --parse--> handle_frame --> server | client | actors
//   a large frame's data --start_frame/start_direct--> its own buffer (Note [direct fragment data])

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "executor.hpp"
#include "rpc/actor_frame_carrier.hpp"
#include "rpc/call_client.hpp"
#include "rpc/call_server.hpp"
#include "rpc/channel_config.hpp"
#include "rpc/channel_conn.hpp"
#include "rpc/channel_listener.hpp"
#include "rpc/fragment.hpp"

namespace troupe::detail {

/// Reads and routes the frames of one direct channel's connections (see the note). Any thread
/// that holds a connection's reading role; one reader per connection at a time.
class frame_reader {
 public:
  /// Drops a connection: closes it and fails what waits on it, naming `why`.
  using drop_fn = std::function<void(const std::shared_ptr<channel_conn>& c, const std::string& why)>;
  /// Admits an incoming connection whose auth frame redeemed `t`; `shm_ok`: the peer can open
  /// this node's memory (Note [shm reachability]).
  using admit_fn = std::function<void(channel_conn& c, channel_listener::ticket&& t, bool shm_ok)>;

  frame_reader(const direct_channel_config& cfg, channel_listener& listener, call_server& server, call_client& client,
               actor_frame_carrier& actors, std::uint32_t max_body, drop_fn drop, admit_fn admit);

  /// Reads `c` and handles every whole frame read. `jobs`: where served calls go (the leader's
  /// list), or null: posted to the executor. `block_first`: wait in the first recv (Note
  /// [blocking first read] in rpc/channel_conn.hpp). False: `c` was dropped (closed, malformed).
  bool read(const std::shared_ptr<channel_conn>& c, led_jobs* jobs, bool block_first);

 private:
  /// Parses the whole frames at the start of `c->in`. Starts reading the data of an incomplete
  /// later fragment, or the payload of an incomplete large request or response, straight into
  /// its buffer (Note [direct fragment data]). Erases what it used. False: `c` was dropped.
  bool parse_frames(const std::shared_ptr<channel_conn>& c, led_jobs* jobs);
  bool handle_frame(const std::shared_ptr<channel_conn>& c, std::uint8_t kind, const char* body, std::size_t n, led_jobs* jobs);
  bool on_auth(const std::shared_ptr<channel_conn>& c, const char* body, std::size_t n);
  /// Note [fragments] (rpc/fragment.hpp). False: malformed (the caller drops the connection), or
  /// the inner frame dropped it.
  bool on_fragment(const std::shared_ptr<channel_conn>& c, const char* body, std::size_t n, led_jobs* jobs);
  /// A message put together from fragments, or read straight into its buffer (Note [direct
  /// fragment data]): handled as its inner frame. False as on_fragment.
  bool on_assembled(const std::shared_ptr<channel_conn>& c, fragment_streams::assembled&& a, led_jobs* jobs);
  /// Drops `c` for a malformed frame (and says so on stderr).
  void drop_malformed(const std::shared_ptr<channel_conn>& c);

  const direct_channel_config& cfg_;
  channel_listener& listener_;
  call_server& server_;
  call_client& client_;
  actor_frame_carrier& actors_;
  std::uint32_t max_body_;
  drop_fn drop_;
  admit_fn admit_;
};

}  // namespace troupe::detail
