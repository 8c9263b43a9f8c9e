// A direct RPC connection (rpc/channel_conn.hpp).
#include "rpc/channel_conn.hpp"

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

channel_conn::channel_conn(int fd, bool outgoing) : fd_(fd), outgoing_(outgoing) {
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  // Note [blocking first read]: a blocking socket whose blocking reads give up after
  // first_read_slice; every other call on it passes MSG_DONTWAIT.
  ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(first_read_slice).count();
  const timeval slice{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
  ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &slice, sizeof slice);
  if (outgoing_) reader_wake = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

channel_conn::~channel_conn() {
  ::close(fd_);
  if (reader_wake >= 0) ::close(reader_wake);
}

void channel_conn::close() {
  if (!closed_.exchange(true, std::memory_order_acq_rel)) ::shutdown(fd_, SHUT_RDWR);
}

bool channel_conn::send_all(const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t k = ::send(fd_, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
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

bool channel_conn::send_parts(const part* parts, std::size_t count) {
  if (count == 1) return send_all(parts[0].data, parts[0].size);
  std::vector<iovec> iov;
  for (std::size_t i = 0; i < count; ++i)
    if (parts[i].size > 0) iov.push_back(iovec{const_cast<char*>(parts[i].data), parts[i].size});
  std::size_t first = 0;
  while (first < iov.size()) {
    msghdr mh{};
    mh.msg_iov = iov.data() + first;
    mh.msg_iovlen = iov.size() - first;
    const ssize_t k = ::sendmsg(fd_, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
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

bool channel_conn::write(const char* data, std::size_t n) {
  const part p{data, n};
  return write_parts(&p, 1);
}

bool channel_conn::write_parts(const part* parts, std::size_t count, bool own_turn) {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    if (closed()) return false;
    if (flushing_ && own_turn) {
      // A fragment waits for the flusher instead of handing it its bytes. Otherwise a small
      // writer that happened to be flushing would send every later fragment of the large frame.
      // Its own call would then wait for the whole transfer.
      ++turn_waiters_;
      while (flushing_ && !closed()) turn_cv_.wait_for(lock, std::chrono::milliseconds(50));
      --turn_waiters_;
      if (closed()) return false;
    }
    if (flushing_) {  // the flushing writer sends these bytes too, after its own
      for (std::size_t i = 0; i < count; ++i) out_.insert(out_.end(), parts[i].data, parts[i].data + parts[i].size);
      return true;
    }
    flushing_ = true;  // out_ is empty whenever nobody flushes
  }
  // Nobody else is writing: send straight from the caller's buffers, then what others queued.
  // No copy into out_: for a large tensor sent as bytes, that copy would be a whole pass over it.
  bool ok = send_parts(parts, count);
  for (;;) {
    if (!ok) {
      close();
      std::lock_guard<std::mutex> lock(mutex_);
      out_.clear();
      flushing_ = false;
      if (turn_waiters_ > 0) turn_cv_.notify_all();
      return false;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      spare_.clear();
      if (out_.empty()) {
        flushing_ = false;
        if (turn_waiters_ > 0) turn_cv_.notify_all();
        return true;
      }
      out_.swap(spare_);
    }
    ok = send_all(spare_.data(), spare_.size());
  }
}

// Note [fragments]: few unsent bytes in the kernel while fragments go out. So a small frame
// written between two of them is not queued behind megabytes there. Only then: a whole frame
// cannot be passed anyway, and the low-water mark costs a wake-up of its writer per 256 KiB.
channel_conn::fragmenting::fragmenting(channel_conn& c) : c_(c) {
  std::lock_guard<std::mutex> lock(c_.lowat_mutex_);
  if (c_.fragment_writers_++ == 0) {
    const int low = unsent_low_water;
    ::setsockopt(c_.fd_, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &low, sizeof low);
  }
}

channel_conn::fragmenting::~fragmenting() {
  std::lock_guard<std::mutex> lock(c_.lowat_mutex_);
  if (--c_.fragment_writers_ == 0) {
    const int none = 0;  // 0: the system's default again (no low-water mark)
    ::setsockopt(c_.fd_, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &none, sizeof none);
  }
}

bool channel_conn::write_fragmented(const part* parts, std::size_t count) {
  if (count == 0 || parts[0].size < frame_header_size) return false;
  const auto inner = static_cast<std::uint8_t>(parts[0].data[4]);
  // The inner frame's body: the parts less the 5-byte frame header.
  std::vector<part> body;
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t skip = i == 0 ? frame_header_size : 0;
    if (parts[i].size > skip) body.push_back(part{parts[i].data + skip, parts[i].size - skip});
    total += parts[i].size - skip;
  }
  const std::uint32_t stream = next_stream_.fetch_add(1, std::memory_order_relaxed);
  const fragmenting guard(*this);
  std::size_t at = 0, off = 0;  // the next byte: body[at], offset off
  std::uint64_t sent = 0;
  do {
    part ps[8];  // the fragment's head, then its data (at most 7 pieces of the body)
    std::size_t k = 1, n = 0;
    while (n < fragment_bytes && at < body.size() && k < 8) {
      const std::size_t take = std::min(fragment_bytes - n, body[at].size - off);
      ps[k++] = part{body[at].data + off, take};
      n += take;
      off += take;
      if (off == body[at].size) {
        ++at;
        off = 0;
      }
    }
    const fragment_head h{stream,
                          static_cast<std::uint8_t>((sent == 0 ? fragment_first : 0) | (sent + n == total ? fragment_last : 0)),
                          inner, total};
    unsigned char head[frame_header_size + fragment_head_size];
    write_fragment_head(head, h, n);
    ps[0] = part{reinterpret_cast<const char*>(head), sizeof head};
    if (!write_parts(ps, k, true)) return false;
    sent += n;
  } while (sent < total);
  return true;
}

bool channel_conn::read_available(bool block_first, std::size_t budget) {
  std::size_t got = 0;
  int flags = block_first ? 0 : MSG_DONTWAIT;
  more_to_read = false;
  for (;;) {
    // Note [fragments]: while a large message streams in, what follows it is parsed and served
    // after at most this much, not after the whole message. That is a small call between two
    // fragments. Poll is level-triggered: the rest is read on the next round.
    if (got >= budget) {
      more_to_read = true;
      return true;
    }
    const std::size_t at = in.size();
    // Note [direct fragment data]: the rest of a fragment goes straight into its stream's
    // buffer, as much as it has room for now. With its last bytes, a little after it goes into
    // `in`: the next fragment's head, or small frames.
    const std::size_t direct = streams.direct_room();
    const bool tail = direct > 0 && direct == streams.direct_left();
    // 64 KiB, or the room a large frame's reservation left (frame_reader::parse_frames).
    const std::size_t chunk = direct > 0 ? (tail ? direct_tail_bytes : 0)
                                         : std::min(std::clamp<std::size_t>(in.capacity() - at, 65536, max_read_bytes), budget - got);
    in.resize(at + chunk);
    ssize_t k = 0;
    if (direct > 0) {
      iovec iov[2] = {{streams.direct_target(), direct}, {in.data() + at, chunk}};
      msghdr mh{};
      mh.msg_iov = iov;
      mh.msg_iovlen = tail ? 2 : 1;
      k = ::recvmsg(fd_, &mh, flags);
    } else {
      k = ::recv(fd_, in.data() + at, chunk, flags);
    }
    flags = MSG_DONTWAIT;
    const std::size_t n = k > 0 ? static_cast<std::size_t>(k) : 0;
    const std::size_t to_direct = std::min(n, direct);
    if (to_direct > 0) streams.direct_advance(to_direct);
    in.resize(at + (n - to_direct));
    got += n;
    if (n > 0) bytes_read.fetch_add(n, std::memory_order_relaxed);
    // A short read drained the socket, so no recv that would only say EAGAIN. Poll is
    // level-triggered: more that arrives later, or an EOF behind these bytes, is seen next poll.
    if (k > 0 && n < direct + chunk) return true;
    if (k > 0 && direct > 0) {  // the fragment is in: its stream and the next head are parsed first
      more_to_read = true;
      return true;
    }
    if (k > 0) continue;
    if (k == 0) return false;
    if (errno == EINTR) continue;
    return errno == EAGAIN || errno == EWOULDBLOCK;
  }
}

}  // namespace troupe::detail
