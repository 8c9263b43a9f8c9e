#pragma once
/// \file tls_session.hpp
/// One TLS connection over a non-blocking socket (Note [tls] in tls_context.hpp). Used by one
/// thread at a time.

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "troupe/actors/tls_context.hpp"

struct ssl_st;

namespace troupe {

class tls_session {
 public:
  enum class role { client, server };
  /// Wraps `fd` (not owned; it must outlive this object). The handshake runs on handshake()
  /// or the first read/write.
  tls_session(std::shared_ptr<const tls_context> ctx, int fd, role r);
  ~tls_session();
  tls_session(const tls_session&) = delete;
  tls_session& operator=(const tls_session&) = delete;

  /// Completes the handshake before `deadline`; throws errc::unauthorized with OpenSSL's reason
  /// (e.g. the peer's certificate does not verify), peer_lost on EOF, timeout past the deadline.
  void handshake(std::chrono::steady_clock::time_point deadline);
  /// One non-blocking step of the handshake: true once it is complete, false to poll for wants()
  /// and call again. Throws as handshake() does.
  bool handshake_step();
  /// Like recv/send: > 0 bytes moved, 0 the peer closed, -1 with errno set. EAGAIN: poll for
  /// wants() and retry. EPROTO: a TLS failure, described by last_error().
  ssize_t read_some(void* p, std::size_t n);
  ssize_t write_some(const void* p, std::size_t n);
  /// Lets a read take many records from the socket in one recv (OpenSSL's read-ahead). Bytes
  /// can then wait inside the session while the socket is empty: only for a user that reads
  /// until EAGAIN before it polls.
  void read_ahead();
  /// The poll events the last EAGAIN waits for (POLLIN or POLLOUT).
  short wants() const noexcept { return wants_; }
  /// OpenSSL's description of the last TLS failure, or "".
  const std::string& last_error() const noexcept { return last_error_; }

 private:
  ssize_t finish(int rc, short natural);

  std::shared_ptr<const tls_context> ctx_;
  ssl_st* ssl_ = nullptr;
  short wants_;
  std::string last_error_;
};

}  // namespace troupe
