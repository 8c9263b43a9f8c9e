#pragma once
// Writing the direct channel's frames under the transport hook's decision
// (Note [transport hook]). The decision says how many copies, after what delay, and whether a
// reply batch holds them (Note [reply batch]). A large payload is sent without copying it into
// the frame (rpc/split_frame.hpp).
//
//   small frame ---------> this thread's scratch buffer --> write (no allocation per call)
//   large payload -------> split frame --> write_parts, or write_fragmented on the writer thread
//   borrowed tensors ----> split frame gathering them --> written on this thread (Note [borrowed
//                          tensor bytes])
//   copies, delay, batch -> one kept buffer --> written n times, later, or when the batch ends
//
// A write to a closed connection fails silently: whoever reads that connection sees it close
// and fails its calls.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "rpc/borrowed_parts.hpp"
#include "rpc/channel_conn.hpp"
#include "rpc/frame_writer.hpp"
#include "rpc/wire.hpp"
#include "troupe/actors/messages.hpp"
#include "troupe/actors/rpc/reply_batch.hpp"
#include "troupe/actors/transport.hpp"

namespace troupe::detail {

class bulk_names;
struct split_frame;

/// Sends frames on channel connections. Thread-safe; sends run on the calling thread, except
/// large fragmented frames, which run on the writer thread in the order they were queued.
class frame_sender {
 public:
  /// Runs a function after a delay (the channel's timer queue).
  using later_fn = std::function<void(std::chrono::milliseconds, std::function<void()>)>;
  /// `bulk` (may be null) lends and takes back large payload buffers (Note [byte pool]);
  /// `max_body` bounds a frame body.
  frame_sender(std::shared_ptr<bulk_names> bulk, std::uint32_t max_body, later_fn later);

  /// Encodes `m` as one small frame of `kind` and sends it under `d`. False: it cannot be
  /// encoded (nothing sent).
  bool send(const std::shared_ptr<channel_conn>& c, frame_kind kind, rpc_request& m, const transport_decision& d);
  /// A response given into `batch` is held there (Note [reply batch]).
  bool send(const std::shared_ptr<channel_conn>& c, frame_kind kind, rpc_response& m, const transport_decision& d,
            rpc::reply_batch* batch = nullptr);
  /// Sends `m`, whose payload is large, as a split frame. The writer thread writes one large
  /// enough to go in fragments (Note [fragments]). The payload buffer then goes back to the
  /// pool. False when it is larger than `max_body` (nothing sent).
  /// With `borrowed` parts (Note [borrowed tensor bytes]) the frame is written on this thread.
  /// It returns once the kernel holds all of it, or the connection closed. The parts are
  /// released before it returns.
  bool send_large(const std::shared_ptr<channel_conn>& c, frame_kind kind, rpc_request m, const transport_decision& d,
                  rpc::detail::borrowed_parts borrowed = {});
  bool send_large(const std::shared_ptr<channel_conn>& c, frame_kind kind, rpc_response m, const transport_decision& d,
                  rpc::reply_batch* batch = nullptr, rpc::detail::borrowed_parts borrowed = {});
  /// Sends a whole frame `d.copies` times, after `d.delay`, or holds it in `batch` (a response
  /// written at once).
  void send_copies(const std::shared_ptr<channel_conn>& c, std::vector<char> frame, const transport_decision& d,
                   rpc::reply_batch* batch = nullptr);
  /// Writes what `batch` holds, one write per connection (reply_batch's destructor).
  static void flush(rpc::reply_batch& batch);
  /// Runs the queued large writes and joins the writer thread; later ones run on the caller.
  void stop() { writer_.stop(); }

 private:
  void send_frame(const std::shared_ptr<channel_conn>& c, const std::vector<char>& frame, const transport_decision& d,
                  rpc::reply_batch* batch);
  void send_split(const std::shared_ptr<channel_conn>& c, const split_frame& f, const transport_decision& d, rpc::reply_batch* batch);
  template <class T>
  bool send_small(const std::shared_ptr<channel_conn>& c, frame_kind kind, T& m, const transport_decision& d, rpc::reply_batch* batch);
  template <class T>
  bool send_split_msg(const std::shared_ptr<channel_conn>& c, frame_kind kind, T m, const transport_decision& d,
                      rpc::reply_batch* batch, rpc::detail::borrowed_parts borrowed);

  std::shared_ptr<bulk_names> bulk_;
  std::uint32_t max_body_;
  later_fn later_;
  frame_writer writer_;  // last: joined before the rest goes
};

}  // namespace troupe::detail
