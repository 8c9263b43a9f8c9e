#pragma once
// Requests to the peers' services sent from the thread that has the data (Note [direct
// requests]).
//
// Note [direct requests]
// A first attempt of a PropagateGradients from the root's backward and of a release from the
// thread that ends a context goes from that thread, not through the context actor: one
// long-lived companion actor per container is the sender, and its replies are handed to the
// waiting thread on the thread that received them (no actor hop before the send, none after
// the reply). The messages are the same typed requests to the same service handles, so the fault
// plan and peer supervision apply to them as to the actor's: a request to a lost peer fails at
// once with its cause. An attempt without an answer by its deadline, or with any answer but
// success, is handed to the context actor, which owns retries, polls and the outcome from there
// (Note [context actor]). The peers see one sender per container, not one per context. The
// waiting thread reads the replies itself where it can (Note [caller reads actor replies] in
// troupe/actors/reply_reader.hpp): no I/O thread hop between the reply and the waiter.
//
//   caller ──request(service of W, msg) as the companion──> W ──reply──> companion
//          <──────────── the reply slot, filled on the receiving thread ────┘

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/message.hpp>

#include "troupe/actors/node.hpp"
#include "troupe/actors/reply_reader.hpp"

namespace troupe::dist_autograd {

/// Sends requests as one companion actor and hands each reply (the response, or a caf::error
/// message) to its callback, once, on the thread that delivered it.
class direct_requester {
 public:
  using reply_fn = std::function<void(caf::message&&)>;

  /// Sends as a companion on `n`'s actor system; waiting threads read replies through `n`.
  explicit direct_requester(node& n);
  /// Ends the companion; callbacks still pending are dropped uncalled.
  ~direct_requester();
  direct_requester(const direct_requester&) = delete;
  direct_requester& operator=(const direct_requester&) = delete;

  /// Sends `msg` to `dest` as a request; `fn` gets its reply. With a `deadline`, `fn` gets an
  /// empty message once it passed without a reply (on the actor clock's thread). Returns the key
  /// for cancel.
  std::uint64_t request(const caf::actor& dest, caf::message msg, reply_fn fn,
                        std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max());
  /// Forgets request `key`: a reply that comes later is dropped.
  void cancel(std::uint64_t key);
  node& owner() { return n_; }

 private:
  struct entry {
    reply_fn fn;
    std::chrono::steady_clock::time_point deadline;
  };
  void on_reply(std::uint64_t key, caf::message&& content);
  /// Arms the sweep for `at` unless one is armed for that time or earlier.
  void arm(std::chrono::steady_clock::time_point at);
  /// Hands an empty message to every request past its deadline; arms the next sweep.
  void sweep();

  node& n_;
  caf::actor_system& sys_;
  caf::strong_actor_ptr companion_;
  std::mutex m_;
  std::unordered_map<std::uint64_t, entry> pending_;
  std::uint64_t next_ = 0;  // guarded by m_
  /// When the armed sweep runs (guarded by m_); max: none is armed.
  std::chrono::steady_clock::time_point armed_ = std::chrono::steady_clock::time_point::max();
};

/// The replies to a batch of direct requests, collected for one waiting thread.
class reply_batch {
 public:
  reply_batch();
  /// Sends `msg` to `dest` through `r`; returns its slot.
  std::size_t send(direct_requester& r, const caf::actor& dest, caf::message msg);
  /// Blocks until every slot has a reply or `deadline` passed; cancels the others. A slot
  /// without a reply holds an empty message. Reads the replies itself where it can (Note
  /// [caller reads actor replies]).
  std::vector<caf::message> wait_until(direct_requester& r, std::chrono::steady_clock::time_point deadline);

 private:
  struct shared {
    std::mutex m;
    std::condition_variable cv;
    std::vector<caf::message> replies;
    std::size_t answered = 0;
    reply_reader* reader = nullptr;  // the one this thread reads with now, for poke()
  };
  bool all_answered();
  void read_replies(direct_requester& r, std::chrono::steady_clock::time_point deadline);
  std::shared_ptr<shared> st_;
  std::vector<std::uint64_t> keys_;
  std::vector<caf::actor> dests_;
};

}  // namespace troupe::dist_autograd
