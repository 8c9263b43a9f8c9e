#pragma once
// Replies written together (Note [reply batch]).
//
// Note [reply batch]
//
// A reply_batch holds the answers given into it: reply_later::complete(value, batch) and
// fail(code, message, &batch) for calls that came over the direct channel. They are kept per
// connection, in order, and written with one send per connection when the batch ends. Two
// answers given back to back then reach the caller in one segment. The caller, blocked on the
// first, reads the second with the same wake-up. It does not hand it to its node's I/O thread,
// which would cost two more wake-ups. The RRef owner uses it for a fetch's answer and the
// withheld remote_call answer that follows it (Note [withheld accept]). Only answers given into
// the batch are held; any other answer, on this thread or another, leaves at once. Keep a batch
// short: nothing it holds leaves before it ends. Answers delayed by a fault plan are not held.
//
//   rpc::reply_batch together;
//   fetch_reply->complete(value, together);
//   accept_reply->complete(true, together);
//   // one write per connection here, as `together` ends

#include <memory>

namespace troupe::detail {
class frame_sender;
}

namespace troupe::rpc {

/// Answers written together when the batch ends (Note [reply batch]). Not thread-safe: one
/// thread gives the answers into it and ends it.
class reply_batch {
 public:
  reply_batch();
  ~reply_batch();  ///< writes what it holds, one write per connection; a closed one fails its calls
  reply_batch(const reply_batch&) = delete;
  reply_batch& operator=(const reply_batch&) = delete;

 private:
  friend class troupe::detail::frame_sender;
  struct frames;                    // the held frames per connection (the direct channel's)
  std::unique_ptr<frames> frames_;  // made by the first held answer
};

}  // namespace troupe::rpc
