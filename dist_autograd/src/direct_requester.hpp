#pragma once
// Requests to the peers' services sent from the thread that has the data (Note [direct
// requests]).
//
// Note [direct requests]
// A first attempt of a PropagateGradients or of a release goes from the thread that has the
// data, not through the context actor. That is the root's backward, a served run on the
// service's thread, or the thread that ends a context. One long-lived companion actor per
// container is the sender. Its replies are handed over on the thread that received them: no
// actor hop before the send, none after the reply. The messages are the same typed requests to
// the same service handles. So the fault plan and peer supervision apply to them as to the
// actor's: a request to a lost peer fails at once with its cause. An attempt without an answer
// by its deadline, or with any answer but success, goes to the context actor. It owns retries,
// polls and the outcome from there (Note [context actor]). The peers see one sender per
// container, not one per context. A waiting thread reads the replies itself where it can (Note
// [caller reads actor replies] in troupe/actors/reply_reader.hpp): no I/O thread hop between
// the reply and the waiter.
//
//   caller ──request(service of W, msg) as the companion──> W ──reply──> companion
//          <──────────── the reply slot, filled on the receiving thread ────┘
//
// A request with a deadline needs no waiting thread: one sweep on the actor clock hands an
// empty reply to the requests past their deadline. At most one sweep is armed at a time, for
// the earliest deadline. So a stream of answered requests costs about one timer per deadline
// span, not one per request. The companion is hidden: an armed sweep never delays the actor
// system's shutdown.
//
// Note [one hop paths]
// The threads one hop wakes; worker0 is the caller, worker1 the callee (x -> worker1: f(x)):
// - Forward: a plain rpc_sync with meta bytes. The caller writes the request and reads its
//   response. A worker1 executor thread reads the request and runs f. No actor is involved.
// - Backward: the root's thread runs the local part and writes a propagate_request. Worker1's
//   reading thread hands it to the service's thread (one wake). That runs f's backward. Its
//   recv function writes a propagate_request back to worker0. Worker0's root thread reads it
//   and hands it to its service (one wake), which runs the send function and answers. The
//   worker1 thread that reads that reply answers the root itself. The root's thread reads the
//   answer. Four frames, two round trips; no context actor, scheduler or timer thread.
// - Release: ~context drops the context and writes a release_request; it waits for nothing.
//   Worker1's service drops its copy and answers. The answer ends the release on whichever
//   worker0 thread reads it.
// Any answer but `done` in time brings in the context actor (Note [context actor]).

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
