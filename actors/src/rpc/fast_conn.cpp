// A direct RPC connection (rpc/fast_conn.hpp).
#include "rpc/fast_conn.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace troupe::detail {

fast_conn::fast_conn(int fd, bool outgoing) : fd_(fd), outgoing_(outgoing) {
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
  if (outgoing_) reader_wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

fast_conn::~fast_conn() {
  ::close(fd_);
  if (reader_wake >= 0) ::close(reader_wake);
}

void fast_conn::close() {
  if (!closed_.exchange(true, std::memory_order_acq_rel)) ::shutdown(fd_, SHUT_RDWR);
}

bool fast_conn::send_all(const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t k = ::send(fd_, p, n, MSG_NOSIGNAL);
    if (k > 0) {
      p += k;
      n -= static_cast<std::size_t>(k);
    } else if (k < 0 && errno == EINTR) {
      continue;
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // Full socket: wait in slices so a close() (peer lost, shutdown) ends the wait.
      pollfd pfd{fd_, POLLOUT, 0};
      if (closed()) return false;
      ::poll(&pfd, 1, 50);
    } else {
      return false;
    }
  }
  return true;
}

bool fast_conn::write(const char* data, std::size_t n) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed()) return false;
    if (flushing_) {  // the flushing writer sends these bytes too, after its own
      out_.insert(out_.end(), data, data + n);
      return true;
    }
    flushing_ = true;  // out_ is empty whenever nobody flushes
  }
  // Nobody else is writing: send straight from the caller's frame (no copy into out_; for a large
  // tensor sent as bytes that copy was a whole pass over it), then what others queued meanwhile.
  const char* p = data;
  for (;;) {
    if (!send_all(p, n)) {
      close();
      std::lock_guard<std::mutex> lock(mutex_);
      out_.clear();
      flushing_ = false;
      return false;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    spare_.clear();
    if (out_.empty()) {
      flushing_ = false;
      return true;
    }
    out_.swap(spare_);
    p = spare_.data();
    n = spare_.size();
  }
}

bool fast_conn::read_available() {
  constexpr std::size_t chunk = 65536;
  for (;;) {
    const std::size_t at = in.size();
    in.resize(at + chunk);
    const ssize_t k = ::recv(fd_, in.data() + at, chunk, 0);
    in.resize(at + (k > 0 ? static_cast<std::size_t>(k) : 0));
    // A short read drained the socket (poll is level-triggered: more that arrives later, or an
    // EOF behind these bytes, is seen on the next poll), so no recv that would only say EAGAIN.
    if (k > 0 && static_cast<std::size_t>(k) < chunk) return true;
    if (k > 0) continue;
    if (k == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

}  // namespace troupe::detail
