// One TLS connection over a non-blocking socket (Note [tls]).
#include "troupe/actors/tls_session.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "troupe/tensors/error.hpp"

namespace troupe {

namespace {

// OpenSSL's read buffer with read-ahead: several full records per recv.
constexpr std::size_t read_ahead_bytes = std::size_t{128} << 10;

std::string describe(ssl_st* ssl, int code) {
  std::string s;
  if (code == SSL_ERROR_SSL) {
    char buf[256];
    while (const unsigned long e = ::ERR_get_error()) {
      ::ERR_error_string_n(e, buf, sizeof buf);
      s += s.empty() ? buf : std::string("; ") + buf;
    }
  }
  const long v = ::SSL_get_verify_result(ssl);
  if (v != X509_V_OK) s += std::string(s.empty() ? "" : "; ") + "certificate: " + ::X509_verify_cert_error_string(v);
  ::ERR_clear_error();
  return s.empty() ? "TLS failure" : s;
}

/// OpenSSL writes with write(2), which raises SIGPIPE on a closed peer. While alive, SIGPIPE is
/// blocked in this thread; a SIGPIPE raised meanwhile is consumed, so a closed peer is an EPIPE.
class sigpipe_guard {
 public:
  sigpipe_guard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~sigpipe_guard() {
    const int saved = errno;
    sigset_t pending;
    sigpending(&pending);
    if (!was_pending_ && sigismember(&pending, SIGPIPE) == 1) {
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
    errno = saved;
  }
  sigpipe_guard(const sigpipe_guard&) = delete;
  sigpipe_guard& operator=(const sigpipe_guard&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_;
  bool was_pending_ = false;
};

}  // namespace

tls_session::tls_session(std::shared_ptr<const tls_context> ctx, int fd, role r)
    : ctx_(std::move(ctx)), wants_(r == role::client ? POLLOUT : POLLIN) {
  ssl_ = ::SSL_new(ctx_->native());
  if (ssl_ == nullptr || ::SSL_set_fd(ssl_, fd) != 1) {
    ::SSL_free(ssl_);
    throw error(errc::io_error, "tls: cannot create an SSL object for the connection");
  }
  if (r == role::client)
    ::SSL_set_connect_state(ssl_);
  else
    ::SSL_set_accept_state(ssl_);
}

tls_session::~tls_session() { ::SSL_free(ssl_); }

ssize_t tls_session::finish(int rc, short natural) {
  if (rc > 0) return rc;
  const int code = ::SSL_get_error(ssl_, rc);
  switch (code) {
    case SSL_ERROR_WANT_READ:
      wants_ = POLLIN;
      errno = EAGAIN;
      return -1;
    case SSL_ERROR_WANT_WRITE:
      wants_ = POLLOUT;
      errno = EAGAIN;
      return -1;
    case SSL_ERROR_ZERO_RETURN:
      return 0;
    case SSL_ERROR_SYSCALL:
      ::ERR_clear_error();
      if (errno == 0 || errno == EAGAIN) return 0;  // EOF without close_notify: the peer closed
      return -1;
    default:
      // OpenSSL 3 reports an EOF without close_notify as an error; it is the peer closing.
      if (code == SSL_ERROR_SSL && ERR_GET_REASON(::ERR_peek_error()) == SSL_R_UNEXPECTED_EOF_WHILE_READING) {
        ::ERR_clear_error();
        return 0;
      }
      last_error_ = describe(ssl_, code);
      wants_ = natural;
      errno = EPROTO;
      return -1;
  }
}

ssize_t tls_session::read_some(void* p, std::size_t n) {
  const sigpipe_guard guard;
  errno = 0;
  return finish(::SSL_read(ssl_, p, static_cast<int>(std::min<std::size_t>(n, INT_MAX))), POLLIN);
}

void tls_session::read_ahead() {
  ::SSL_set_read_ahead(ssl_, 1);
  ::SSL_set_default_read_buffer_len(ssl_, read_ahead_bytes);
}

ssize_t tls_session::write_some(const void* p, std::size_t n) {
  const sigpipe_guard guard;
  errno = 0;
  return finish(::SSL_write(ssl_, p, static_cast<int>(std::min<std::size_t>(n, INT_MAX))), POLLOUT);
}

bool tls_session::handshake_step() {
  ssize_t r = 0;
  {
    const sigpipe_guard guard;
    errno = 0;
    r = finish(::SSL_do_handshake(ssl_), POLLIN);
  }
  if (r > 0) return true;
  if (r == 0) throw error(errc::peer_lost, "tls: the peer closed the connection during the handshake");
  if (errno == EAGAIN || errno == EINTR) return false;
  if (errno == EPROTO) throw error(errc::unauthorized, "tls: handshake refused: " + last_error_);
  throw error(errc::peer_lost, "tls: handshake failed: " + std::string(std::strerror(errno)));
}

void tls_session::handshake(std::chrono::steady_clock::time_point deadline) {
  while (!handshake_step()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) throw error(errc::timeout, "tls: no handshake before the deadline");
    pollfd pf{::SSL_get_fd(ssl_), wants_, 0};
    ::poll(&pf, 1, static_cast<int>(std::min<long long>(left, 20)));
  }
}

}  // namespace troupe
