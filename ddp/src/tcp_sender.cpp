// The sender thread of the TCP ring (Note [tcp ring]): writes queued frames to one socket.
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "tcp_transport.hpp"

namespace troupe::ddp::detail {

tcp_sender::tcp_sender(tcp_socket& sock, std::string peer) : sock_(&sock), fd_(sock.fd()), peer_(std::move(peer)) {
  thread_ = std::thread([this] { loop(); });
}

tcp_sender::~tcp_sender() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  aborted_.store(true);
  cv_.notify_all();
  thread_.join();
}

void tcp_sender::push(frame_type t, const std::byte* data, std::size_t n, bool copy) {
  job j{t, data, n, {}, false};
  if (copy) {
    j.owned.assign(data, data + n);
    j.data = j.owned.data();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(j));
  }
  cv_.notify_all();
}

void tcp_sender::push_raw(const std::byte* data, std::size_t n) {
  job j{frame_type::data, nullptr, 0, std::vector<std::byte>(data, data + n), true};
  j.data = j.owned.data();
  j.n = n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(j));
  }
  cv_.notify_all();
}

std::optional<troupe::error> tcp_sender::error() {
  std::lock_guard<std::mutex> lock(mu_);
  return err_;
}

void tcp_sender::flush(std::chrono::steady_clock::time_point deadline, const std::string& what) {
  if (!flush_until(deadline))
    throw troupe::error(errc::timeout, what + ": writing to " + peer_ + " did not finish before the deadline");
}

bool tcp_sender::flush_until(std::chrono::steady_clock::time_point until) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_until(lock, until, [&] { return err_.has_value() || (queue_.empty() && !busy_); })) return false;
  if (err_) throw *err_;
  return true;
}

void tcp_sender::abort(const std::string& reason) noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    abort_reason_ = reason;
  }
  aborted_.store(true, std::memory_order_release);
  cv_.notify_all();
  // The worker releases the tensors once this returns: wait until no frame reads them (bounded:
  // the current frame gets one second, the abort frame one more).
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::seconds(3), [&] { return stopped_; });
}

bool tcp_sender::write_all(const std::byte* p, std::size_t n) {
  // After an abort the frame being written is finished, so that the abort frame can follow and
  // name the first failure, but within one second.
  while (n > 0) {
    if (aborted_.load(std::memory_order_acquire)) {
      const auto now = std::chrono::steady_clock::now();
      if (!give_up_) give_up_ = now + std::chrono::seconds(1);
      if (now > *give_up_) return false;
    }
    const ssize_t put = sock_->send_some(p, n);
    if (put > 0) {
      p += put;
      n -= static_cast<std::size_t>(put);
    } else if (put < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd pf{fd_, sock_->wants(POLLOUT), 0};
      ::poll(&pf, 1, 20);  // a slice: the abort flag is checked between slices
    } else {
      std::lock_guard<std::mutex> lock(mu_);
      if (!err_)
        err_ = troupe::error(errc::peer_lost, "process_group (tcp): " + peer_ + " is unreachable (" +
                                                  std::string(put == 0 ? "closed" : sock_->error_text(errno)) +
                                                  "): it exited or was killed");
      return false;
    }
  }
  return true;
}

void tcp_sender::loop() {
  bool clean = true;
  for (;;) {
    job j;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || aborted_.load() || !queue_.empty(); });
      if (aborted_.load() || stopping_) break;
      j = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    frame_header h{static_cast<std::uint32_t>(j.type), 0, j.n};
    const bool ok = (j.raw || write_all(reinterpret_cast<const std::byte*>(&h), sizeof(h))) && write_all(j.data, j.n);
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
      if (!ok) queue_.clear();
    }
    cv_.notify_all();
    if (!ok) {
      clean = false;  // cut mid-frame or the peer is gone: no abort frame can follow
      break;
    }
  }
  // Between frames: tell the next rank why we stop (best effort), then close our side.
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(mu_);
    reason = abort_reason_;
    queue_.clear();
    if (!err_) err_ = troupe::error(errc::peer_lost, "process_group (tcp): the group failed: " + reason);
  }
  cv_.notify_all();
  if (clean && !reason.empty()) {
    frame_header h{static_cast<std::uint32_t>(frame_type::abort), 0, reason.size()};
    if (write_all(reinterpret_cast<const std::byte*>(&h), sizeof(h)))
      write_all(reinterpret_cast<const std::byte*>(reason.data()), reason.size());
  }
  ::shutdown(fd_, SHUT_RDWR);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
}

}  // namespace troupe::ddp::detail
