// A direct RPC connection (rpc/fast_conn.hpp).
#include "rpc/fast_conn.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

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

bool fast_conn::send_parts(const part* parts, std::size_t count) {
  if (count == 1) return send_all(parts[0].data, parts[0].size);
  std::vector<iovec> iov;
  for (std::size_t i = 0; i < count; ++i)
    if (parts[i].size > 0) iov.push_back(iovec{const_cast<char*>(parts[i].data), parts[i].size});
  std::size_t first = 0;
  while (first < iov.size()) {
    msghdr mh{};
    mh.msg_iov = iov.data() + first;
    mh.msg_iovlen = iov.size() - first;
    const ssize_t k = ::sendmsg(fd_, &mh, MSG_NOSIGNAL);
    if (k > 0) {
      auto left = static_cast<std::size_t>(k);
      while (first < iov.size() && left >= iov[first].iov_len) left -= iov[first++].iov_len;
      if (left > 0) {
        iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
        iov[first].iov_len -= left;
      }
    } else if (k < 0 && errno == EINTR) {
      continue;
    } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pfd{fd_, POLLOUT, 0};  // as in send_all: slices, so a close() ends the wait
      if (closed()) return false;
      ::poll(&pfd, 1, 50);
    } else {
      return false;
    }
  }
  return true;
}

bool fast_conn::write(const char* data, std::size_t n) {
  const part p{data, n};
  return write_parts(&p, 1);
}

bool fast_conn::write_parts(const part* parts, std::size_t count) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed()) return false;
    if (flushing_) {  // the flushing writer sends these bytes too, after its own
      for (std::size_t i = 0; i < count; ++i) out_.insert(out_.end(), parts[i].data, parts[i].data + parts[i].size);
      return true;
    }
    flushing_ = true;  // out_ is empty whenever nobody flushes
  }
  // Nobody else is writing: send straight from the caller's buffers (no copy into out_; for a
  // large tensor sent as bytes that copy was a whole pass over it), then what others queued.
  bool ok = send_parts(parts, count);
  for (;;) {
    if (!ok) {
      close();
      std::lock_guard<std::mutex> lock(mutex_);
      out_.clear();
      flushing_ = false;
      return false;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      spare_.clear();
      if (out_.empty()) {
        flushing_ = false;
        return true;
      }
      out_.swap(spare_);
    }
    ok = send_all(spare_.data(), spare_.size());
  }
}

bool fast_conn::read_available() {
  for (;;) {
    const std::size_t at = in.size();
    // 64 KiB, or the room a large frame's reservation left (fast_path::on_readable).
    const std::size_t chunk = std::max<std::size_t>(65536, in.capacity() - at);
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
