#pragma once
/// \file reply_reader.hpp
/// A thread that blocks for replies of a remote actor reads them itself.
///
/// Note [caller reads actor replies]
///
/// A plain thread (not an actor) may send requests to a remote actor and then block for the
/// replies. It reads the connection they come on, as an rpc_sync caller reads its response
/// (Note [direct channel]). A reply then reaches its receiver on that thread. No I/O thread
/// wakes up in between, so the round trip wakes two threads, as an rpc_sync does.
///   * The thread takes the connection's reading role. That is only this node's outgoing
///     connection to the actor's node. It must carry that node's actor frames, and no other
///     thread may read it as a caller. Otherwise read_until() returns false at once and the thread
///     waits another way.
///   * It delivers every frame it reads as the I/O thread would: other actors' messages, the
///     transport hook's decisions. A delayed frame is delivered later from the I/O thread.
///   * A reply may come another way: a delay, a local error, another connection. It is seen
///     when its receiver calls poke(), or at the latest after one poll slice (200 ms).
///   * The role ends with read_until(): the I/O thread reads the connection again.
///
///   thread: request(service of W) ──frame──▶ W
///   thread: read_until(done) ◀──reply frame── W   (the reply's receiver runs on this thread)

#include <chrono>
#include <functional>
#include <memory>

#include <caf/fwd.hpp>

namespace troupe {

class node;

namespace detail {
class direct_channel;
class channel_conn;
}  // namespace detail

/// Reads the replies of one remote actor on the calling thread (see the note). Not copyable;
/// one thread calls read_until() at a time, any thread poke().
class reply_reader {
 public:
  /// For replies of `dest`. Never blocks; a local or null `dest`, or a node without a direct
  /// channel, makes a reader that cannot read.
  reply_reader(node& n, const caf::actor& dest);
  ~reply_reader();
  reply_reader(const reply_reader&) = delete;
  reply_reader& operator=(const reply_reader&) = delete;

  /// Blocks, reading, until `done()` holds, `deadline` passes or the connection closes; true
  /// then. False at once when this thread cannot read (see the note): nothing was read.
  /// `done` runs on this thread, between reads.
  bool read_until(const std::function<bool()>& done, std::chrono::steady_clock::time_point deadline);
  /// A read_until() in progress checks `done()` again soon. Any thread; nothing when none runs.
  void poke();

 private:
  std::weak_ptr<detail::direct_channel> channel_;
  std::shared_ptr<detail::channel_conn> conn_;
};

}  // namespace troupe
