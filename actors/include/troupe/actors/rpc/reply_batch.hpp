#pragma once
// Replies written together (Note [reply batch]).
//
// Note [reply batch]
// While a reply_batch lives on a thread, the answers this thread gives to calls that came over the
// direct channel (a served function's return, reply_later::complete/fail) are not written at
// once: they are kept per connection, in order, and written with one send per connection when the
// outermost batch on the thread ends. Two answers given back to back then reach the caller in
// one segment, so the caller, blocked on the first, reads the second with the same wake-up instead
// of handing it to its node's I/O thread (two more wake-ups). The RRef owner uses it for a fetch's
// answer and the withheld remote_call answer that follows it (Note [withheld accept]). Keep a
// batch short: nothing it holds leaves before it ends. Answers delayed by a fault plan are not held.

namespace troupe::rpc {

class reply_batch {
 public:
  reply_batch();
  ~reply_batch();  ///< the outermost batch writes what it holds
  reply_batch(const reply_batch&) = delete;
  reply_batch& operator=(const reply_batch&) = delete;
};

}  // namespace troupe::rpc
