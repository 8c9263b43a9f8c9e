// A socket of the TCP ring, plain or through TLS (Note [tcp ring]).
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tcp_transport.hpp"

namespace troupe::ddp::detail {

tcp_socket::~tcp_socket() {
  tls_.reset();
  if (fd_ >= 0) ::close(fd_);
}

tcp_socket& tcp_socket::operator=(tcp_socket&& o) noexcept {
  if (this != &o) {
    tls_.reset();
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    tls_ = std::move(o.tls_);
    o.fd_ = -1;
  }
  return *this;
}

void tcp_socket::start_tls(std::shared_ptr<const tls_context> ctx, tls_session::role r) {
  tls_ = std::make_unique<tls_session>(std::move(ctx), fd_, r);
}

ssize_t tcp_socket::recv_some(std::byte* p, std::size_t n) { return tls_ ? tls_->read_some(p, n) : ::recv(fd_, p, n, 0); }

ssize_t tcp_socket::send_some(const std::byte* p, std::size_t n) {
  return tls_ ? tls_->write_some(p, n) : ::send(fd_, p, n, MSG_NOSIGNAL);
}

std::string tcp_socket::error_text(int e) const {
  return e == EPROTO && tls_ ? "TLS: " + tls_->last_error() : std::string(std::strerror(e));
}

}  // namespace troupe::ddp::detail
