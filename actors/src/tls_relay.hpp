#pragma once
// Plain sockets in front of a node's TLS connections (Note [tls relay]).
//
// Note [tls relay]
//
// With node_options::tls set, every connection between nodes that the node makes or accepts is
// a TCP socket carrying mutual TLS (Note [tls]). That covers the direct channel and the CAF
// port's gate, and so BASP, which carries the store, the hellos and the heartbeats. The code
// that uses the connection gets one end of a local socket pair instead of the TCP socket. One
// relay thread per connection moves the bytes between the pair and the TLS connection:
//
//   user code <--plain--> [socket pair] <--relay thread--> TLS <--TCP--> peer
//
// * TLS off: no relay; users get the TCP socket itself, so the hot path is unchanged.
// * Client side: the caller runs the handshake, bounded by its deadline. A server that refuses
//   this node's certificate is seen at the first read under TLS 1.3; refusal() then tells why.
// * Server side: the relay thread runs the handshake, bounded by the listener's auth deadline.
//   The listener gets the pair's end at once and applies Note [connection hygiene] to it. A
//   refused peer is logged on stderr with its address and OpenSSL's reason; its pair end is
//   closed, which the listener reads as EOF. The listener keeps accepting.
// * A closed pair end closes the TCP connection. A closed or failed TLS connection closes the
//   pair end after its received bytes are delivered: users see EOF as with plain TCP.
// * There is no fallback: a peer that speaks no TLS fails the handshake and is refused.
// * stop() shuts every TCP connection down and joins every relay thread.
// Cost with TLS on: the cipher, two copies through the pair, one thread per connection.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/actors/tls_context.hpp"
#include "troupe/actors/tls_session.hpp"

namespace troupe::detail {

/// The relays of one node. Thread-safe.
class tls_relays {
 public:
  /// `who` names the node in the lines on stderr.
  tls_relays(std::string who, std::shared_ptr<const tls_context> ctx);
  ~tls_relays();
  tls_relays(const tls_relays&) = delete;
  tls_relays& operator=(const tls_relays&) = delete;

  /// Client side: takes the connected TCP socket `tcp_fd` (to `where`, for messages). It runs
  /// the handshake before `deadline` and returns the plain end (non-blocking, close-on-exec; the
  /// caller owns it). Throws unauthorized (the peer's certificate does not verify, or the peer
  /// refused ours), peer_lost (closed) or timeout; the socket is closed then.
  int connect(int tcp_fd, const std::string& where, std::chrono::steady_clock::time_point deadline);
  /// Server side: takes the accepted TCP socket and returns the plain end at once. The handshake
  /// runs on the relay thread and must end within `handshake_bound`. Throws io_error when no
  /// socket pair or thread can be made (the socket is closed then).
  int accept(int tcp_fd, std::chrono::milliseconds handshake_bound);
  /// Why the relay behind the plain end `plain_fd` ended with a TLS failure, or "" (none, or
  /// not ended yet). Tells a refused certificate from a lost connection.
  std::string refusal(int plain_fd);
  /// Waits up to `bound` until every relay ended by itself. A relay ends when its user closed the
  /// plain end and the bytes written before went out, or when the peer closed. True when all did.
  /// Lets a process deliver its last words before stop() cuts the connections.
  bool drain(std::chrono::milliseconds bound);
  /// Shuts every connection down and joins every relay thread. Idempotent.
  void stop();

  struct relay;

 private:
  int start(int tcp_fd, std::unique_ptr<tls_session> s, std::string peer, bool server,
            std::chrono::steady_clock::time_point handshake_deadline);
  void reap();  // under mutex_: joins relays whose thread ended
  void log_refusal(const std::string& peer, const std::string& why, bool server);

  std::string who_;
  std::shared_ptr<const tls_context> ctx_;
  std::mutex mutex_;
  std::condition_variable ended_;  // a relay thread ended (under mutex_)
  std::vector<std::unique_ptr<relay>> relays_;
  std::map<int, std::string> refusals_;  // a plain end's number -> why TLS refused its connection
  bool stopping_ = false;
  std::atomic<bool> quiet_{false};  // stop() began: ended handshakes are not refusals
  std::mutex log_mutex_;
  std::chrono::steady_clock::time_point log_window_{};
  std::size_t logged_in_window_ = 0, unlogged_ = 0;
};

}  // namespace troupe::detail
