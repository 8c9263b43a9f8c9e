#pragma once
// One direct RPC connection (Note [direct channel] in rpc/direct_channel.hpp). It holds a
// non-blocking TCP socket and its read buffer (the I/O thread's). Its write side combines
// concurrent writes.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <caf/node_id.hpp>

#include "rpc/fragment.hpp"
#include "troupe/actors/rpc/future.hpp"

namespace troupe::detail {

/// An allocator whose resize() leaves new chars uninitialised. The read buffer grows by 64 KiB
/// before each recv; zeroing it would cost two 64 KiB memsets per read.
template <class T>
struct uninit_allocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = uninit_allocator<U>;
  };
  uninit_allocator() = default;
  template <class U>
  uninit_allocator(const uninit_allocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;  // default-initialised: no zeroing
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

/// Note [blocking first read]
/// A thread about to wait for one connection only waits in recv() itself, not in poll() and then
/// recv(). Such threads: a caller waiting for its response, the executor's leader when it leads a
/// single connection. That is one system call per message instead of two on the round trip's
/// critical path. The socket is therefore blocking, with SO_RCVTIMEO = first_read_slice. Every
/// other send and recv on it passes MSG_DONTWAIT. Such a wait cannot also watch an eventfd.
/// Whatever would have woken it is seen when the slice ends. That is another thread completing
/// the caller's call (a deadline, a delayed response, stop()), or an interrupt of the leader. The
/// thread then falls back to poll() on the socket and its eventfd, at most first_read_slice
/// late. A closed connection (peer lost, shutdown) ends the recv at once.
inline constexpr std::chrono::microseconds first_read_slice{1000};

/// A socket owned by the connection (closed with it). Move-only through shared_ptr.
class channel_conn {
 public:
  /// Takes `fd` (made blocking with a receive timeout: Note [blocking first read]; TCP_NODELAY). `outgoing`: this node connected (it sends
  /// requests and reads responses); otherwise it accepted (reads requests, sends responses).
  channel_conn(int fd, bool outgoing);
  ~channel_conn();
  channel_conn(const channel_conn&) = delete;
  channel_conn& operator=(const channel_conn&) = delete;

  int fd() const { return fd_; }
  bool outgoing() const { return outgoing_; }

  /// Appends `n` bytes of whole frames and flushes them. A writer that finds another one
  /// flushing leaves its bytes to it (write combining: under load one send carries many frames).
  /// Blocks while the socket is full (bounded: a closed connection ends the wait). Returns false
  /// when the connection is closed or the send failed (it is then closed).
  bool write(const char* data, std::size_t n);
  /// One frame in several buffers (rpc/split_frame.hpp), written as one (sendmsg); the same
  /// contract as write().
  struct part {
    const char* data;
    std::size_t size;
  };
  /// `own_turn`: wait for a writer that is flushing to finish instead of leaving these bytes to
  /// it (write_fragmented).
  bool write_parts(const part* parts, std::size_t count, bool own_turn = false);
  /// One whole frame in several buffers; the first holds at least its 5-byte header. It is
  /// written as fragments (Note [fragments] in rpc/fragment.hpp), each with write_parts. So
  /// frames of other writers go out between them. The same contract as write().
  bool write_fragmented(const part* parts, std::size_t count);
  /// Shuts the socket down (the I/O thread then sees the hang-up); idempotent, thread-safe.
  void close();
  bool closed() const { return closed_.load(std::memory_order_acquire); }

  /// Reads what is available into `in` (until a recv returns less than it asked for); returns
  /// false on EOF or error. Whoever holds the reading role. `block_first`: the first recv waits
  /// for data, up to first_read_slice (Note [blocking first read]). Reads at most about
  /// `budget` bytes (Note [connection hygiene]: a small one before authentication).
  bool read_available(bool block_first = false, std::size_t budget = max_read_bytes);
  /// The last read_available stopped with bytes possibly left in the socket. Its budget was used,
  /// or a fragment was read straight into its stream (Note [direct fragment data]).
  bool more_to_read = false;
  /// Bytes read so far (tells a blocking first read that timed out from one that read).
  std::atomic<std::uint64_t> bytes_read{0};

  // Identity of the peer: set before the connection is shared (outgoing) or by the I/O thread on
  // the auth frame (accepted; `authed` then true). Read by executor threads after that.
  std::string peer;
  caf::node_id peer_node;
  std::atomic<bool> authed{false};
  /// Read by the executor's leader instead of the I/O thread (set under the channel's lock once
  /// the I/O thread has handed its buffer over).
  bool led = false;
  std::vector<char, uninit_allocator<char>> in;  ///< unparsed bytes (whoever holds the reading role)
  fragment_streams streams;  ///< fragments being put together (the reading role too)

  // The reading role of an outgoing connection (Note [direct channel], "the caller reads its own
  // response"). A caller thread that waits for one of its calls reads the socket itself. The
  // I/O thread reads it only for calls nobody waits on.
  std::mutex read_mutex;                    ///< held while reading and parsing `in`
  std::atomic<bool> caller_reading{false};  ///< a waiting caller reads: the I/O thread stays away
  int reader_wake = -1;                     ///< eventfd (outgoing only): wakes the reading caller
  /// The thread that holds the reading role (set under read_mutex). finish() pokes no one when
  /// it runs on that thread: the reader checks its call after every read.
  std::atomic<std::thread::id> reader_thread{};
  std::shared_ptr<rpc::detail::call_helper> waiter;  ///< outgoing: helps the calls on it (direct_channel::read_until_done)
  // Under the channel's pending lock: calls pending on this connection and those nobody waits
  // on. Also whether a caller that stopped reading left calls behind (the I/O thread reads for
  // them).
  mutable int pending_calls = 0;
  mutable int unattended = 0;
  mutable bool handed_over = false;
  /// Carries remote actor frames (either direction): the I/O thread always polls it when no
  /// caller reads it (Note [remote actors] in remote/remote_actors.hpp).
  std::atomic<bool> actor_traffic{false};

 private:
  /// While one exists, the socket keeps its unsent bytes under unsent_low_water (channel_conn.cpp).
  class fragmenting {
   public:
    explicit fragmenting(channel_conn& c);
    ~fragmenting();
    fragmenting(const fragmenting&) = delete;
    fragmenting& operator=(const fragmenting&) = delete;

   private:
    channel_conn& c_;
  };
  std::mutex lowat_mutex_;
  int fragment_writers_ = 0;  ///< under lowat_mutex_
  bool send_all(const char* p, std::size_t n);
  bool send_parts(const part* parts, std::size_t count);
  int fd_;
  bool outgoing_;
  std::atomic<bool> closed_{false};
  std::mutex mutex_;
  std::vector<char> out_, spare_;
  bool flushing_ = false;
  std::condition_variable turn_cv_;  // flushing_ went false, for write_parts(own_turn)
  int turn_waiters_ = 0;
  std::atomic<std::uint32_t> next_stream_{1};
};

}  // namespace troupe::detail
