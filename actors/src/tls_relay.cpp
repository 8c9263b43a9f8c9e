// Plain sockets in front of a node's TLS connections (Note [tls relay] in tls_relay.hpp).
#include "tls_relay.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "troupe/actors/host_address.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::detail {

namespace {

using clock = std::chrono::steady_clock;

constexpr std::size_t chunk_bytes = 256 * 1024;  // per direction
constexpr int pair_buffer_bytes = 1 << 20;
constexpr int max_poll_ms = 200;
// After the user closed its end, bytes it wrote before still go out for at most this long.
constexpr std::chrono::milliseconds drain_bound{1000};
constexpr std::size_t log_lines_per_second = 10;

int ms_until(clock::time_point t) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(t - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, max_poll_ms));
}

}  // namespace

struct tls_relays::relay {
  int tcp = -1;
  int plain = -1;      // the relay's end of the pair
  int user_plain = -1;  // the user's end (not owned; only to answer refusal())
  std::unique_ptr<tls_session> tls;
  std::string peer;
  std::thread thread;
  std::atomic<bool> done{false};
  bool tcp_ok = true;  // the relay thread's: the handshake succeeded
  const std::atomic<bool>* quit = nullptr;  // tls_relays::stop() began
  std::mutex why_mutex;
  std::string refused;  // a TLS failure that ended the relay (under why_mutex)

  ~relay() {
    if (thread.joinable()) thread.join();
    tls.reset();
    if (tcp >= 0) ::close(tcp);
    if (plain >= 0) ::close(plain);
  }
  void fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(why_mutex);
    refused = why;
  }
  bool server_handshake(clock::time_point deadline);
  void pump();
};

// The handshake on the relay thread; false when it failed (then logged by the caller).
bool tls_relays::relay::server_handshake(clock::time_point deadline) {
  while (!tls->handshake_step()) {
    if (clock::now() >= deadline) throw error(errc::timeout, "no TLS handshake within the listener's deadline");
    // The listener closing our pair end (deadline, cap, shutdown) ends the handshake too.
    pollfd fds[2] = {{tcp, tls->wants(), 0}, {plain, 0, 0}};
    ::poll(fds, 2, ms_until(deadline));
    if (fds[1].revents & (POLLHUP | POLLERR)) throw error(errc::peer_lost, "the listener closed the connection during the TLS handshake");
    if (quit->load()) throw error(errc::invalid_state, "the node is shutting down");
  }
  return true;
}

// Note [tls relay]: moves bytes both ways until either side ends. One thread; never blocks
// outside poll (every socket is non-blocking).
void tls_relays::relay::pump() {
  std::vector<char> up(chunk_bytes), down(chunk_bytes);  // up: plain -> TLS; down: TLS -> plain
  std::size_t up_at = 0, up_end = 0, down_at = 0, down_end = 0;
  short up_wants = POLLOUT, down_wants = POLLIN;
  bool tcp_ended = false, plain_hung_up = false;
  clock::time_point drain_until{};
  for (;;) {
    for (bool moved = true; moved;) {
      moved = false;
      if (down_end == 0) {
        const ssize_t k = tls->read_some(down.data(), down.size());
        if (k > 0) {
          down_at = 0;
          down_end = static_cast<std::size_t>(k);
          // A read gives one record (16 KiB at most): the records already here (read-ahead) go
          // to the user in one send.
          while (down_end < down.size()) {
            const ssize_t more = tls->read_some(down.data() + down_end, down.size() - down_end);
            if (more <= 0) break;  // EAGAIN, EOF or a failure: the next read sees it again
            down_end += static_cast<std::size_t>(more);
          }
          moved = true;
        } else if (k == 0) {
          return;  // the peer closed
        } else if (errno == EAGAIN || errno == EINTR) {
          down_wants = tls->wants();
        } else {
          if (errno == EPROTO) fail(tls->last_error());
          return;
        }
      }
      if (down_end > 0) {
        const ssize_t k = ::send(plain, down.data() + down_at, down_end - down_at, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (k > 0) {
          down_at += static_cast<std::size_t>(k);
          if (down_at == down_end) down_at = down_end = 0;
          moved = true;
        } else if (k < 0 && errno != EAGAIN && errno != EINTR) {
          return;  // the user closed its end
        }
      }
      if (up_end == 0) {
        const ssize_t k = ::recv(plain, up.data(), up.size(), MSG_DONTWAIT);
        if (k > 0) {
          up_at = 0;
          up_end = static_cast<std::size_t>(k);
          moved = true;
        } else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
          return;  // the user closed its end, and everything it wrote went out
        }
      }
      if (up_end > 0) {
        const ssize_t k = tls->write_some(up.data() + up_at, up_end - up_at);
        if (k > 0) {
          up_at += static_cast<std::size_t>(k);
          if (up_at == up_end) up_at = up_end = 0;
          moved = true;
        } else if (errno == EAGAIN || errno == EINTR) {
          up_wants = tls->wants();
        } else {
          if (errno == EPROTO) fail(tls->last_error());
          return;
        }
      }
    }
    if (plain_hung_up && clock::now() >= drain_until) return;
    const short tcp_events = static_cast<short>((down_end == 0 ? down_wants : 0) | (up_end > 0 ? up_wants : 0));
    const short plain_events = static_cast<short>((down_end > 0 ? POLLOUT : 0) | (up_end == 0 ? POLLIN : 0));
    pollfd fds[2] = {{tcp_ended ? -1 : tcp, tcp_events, 0}, {plain_hung_up ? -1 : plain, plain_events, 0}};
    ::poll(fds, 2, max_poll_ms);
    if (quit->load()) return;  // stop(): even a user that no longer reads does not hold the thread
    // A hang-up is reported whatever was asked for. So stop polling that side: the loop must not
    // spin while the other side still has bytes to move.
    if ((fds[0].revents & (POLLHUP | POLLERR)) && down_end > 0) tcp_ended = true;
    if ((fds[1].revents & (POLLHUP | POLLERR)) && !plain_hung_up) {
      plain_hung_up = true;
      drain_until = clock::now() + drain_bound;
    }
  }
}

tls_relays::tls_relays(std::string who, std::shared_ptr<const tls_context> ctx) : who_(std::move(who)), ctx_(std::move(ctx)) {}

tls_relays::~tls_relays() { stop(); }

void tls_relays::stop() {
  std::vector<std::unique_ptr<relay>> all;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    quiet_.store(true);
    all.swap(relays_);
    for (auto& r : all) ::shutdown(r->tcp, SHUT_RDWR);  // ends handshakes and pumps at once
  }
  all.clear();  // joins
}

bool tls_relays::drain(std::chrono::milliseconds bound) {
  std::unique_lock<std::mutex> lock(mutex_);
  return ended_.wait_for(lock, bound, [this] {
    return std::all_of(relays_.begin(), relays_.end(), [](const std::unique_ptr<relay>& r) { return r->done.load(); });
  });
}

void tls_relays::reap() {
  std::erase_if(relays_, [](const std::unique_ptr<relay>& r) { return r->done.load(std::memory_order_acquire); });
}

void tls_relays::log_refusal(const std::string& peer, const std::string& why, bool server) {
  if (quiet_.load()) return;  // stop() ended it
  std::lock_guard<std::mutex> lock(log_mutex_);
  const auto now = clock::now();
  if (now - log_window_ >= std::chrono::seconds(1)) {
    if (unlogged_ > 0) std::fprintf(stderr, "[troupe] %s: refused %zu more TLS connection(s)\n", who_.c_str(), unlogged_);
    log_window_ = now;
    logged_in_window_ = unlogged_ = 0;
  }
  if (logged_in_window_++ >= log_lines_per_second)
    ++unlogged_;
  else if (server)
    std::fprintf(stderr, "[troupe] %s: refused a TLS connection from %s: %s\n", who_.c_str(), peer.c_str(), why.c_str());
  else
    std::fprintf(stderr, "[troupe] %s: the TLS connection to %s failed: %s\n", who_.c_str(), peer.c_str(), why.c_str());
}

int tls_relays::start(int tcp_fd, std::unique_ptr<tls_session> s, std::string peer, bool server, clock::time_point handshake_deadline) {
  auto r = std::make_unique<relay>();
  r->tcp = tcp_fd;
  r->tls = std::move(s);
  r->peer = std::move(peer);
  r->quit = &quiet_;
  int sv[2] = {-1, -1};
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
    throw error(errc::io_error, who_ + ": tls relay: socketpair failed: " + std::strerror(errno));  // r closes tcp
  for (const int fd : sv) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &pair_buffer_bytes, sizeof pair_buffer_bytes);
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &pair_buffer_bytes, sizeof pair_buffer_bytes);
  }
  const int one = 1;
  ::setsockopt(tcp_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  r->plain = sv[1];
  r->user_plain = sv[0];
  relay* raw = r.get();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) {
      ::close(sv[0]);
      throw error(errc::invalid_state, who_ + " is shutting down");
    }
    reap();
    refusals_.erase(sv[0]);  // the number may be a closed connection's
    try {
      r->thread = std::thread([this, raw, server, handshake_deadline] {
        try {
          if (server) raw->server_handshake(handshake_deadline);
        } catch (const error& e) {
          if (e.code() == errc::unauthorized) raw->fail(e.message());
          log_refusal(raw->peer, e.message(), true);
          raw->tcp_ok = false;
        }
        if (raw->tcp_ok) {
          raw->pump();
          std::lock_guard<std::mutex> why(raw->why_mutex);
          if (!raw->refused.empty()) log_refusal(raw->peer, raw->refused, server);
        }
        {
          std::lock_guard<std::mutex> why(raw->why_mutex);
          if (!raw->refused.empty()) {
            std::lock_guard<std::mutex> lock(mutex_);  // before the user reads EOF: refusal() finds it
            refusals_[raw->user_plain] = raw->refused;
          }
        }
        ::shutdown(raw->plain, SHUT_RDWR);  // the user reads EOF
        ::shutdown(raw->tcp, SHUT_RDWR);    // the peer reads EOF
        {
          std::lock_guard<std::mutex> lock(mutex_);
          raw->done.store(true, std::memory_order_release);
        }
        ended_.notify_all();
      });
    } catch (const std::system_error& e) {
      ::close(sv[0]);
      throw error(errc::io_error, who_ + ": tls relay: cannot start a thread: " + e.what());
    }
    relays_.push_back(std::move(r));
  }
  return sv[0];
}

int tls_relays::connect(int tcp_fd, const std::string& where, clock::time_point deadline) {
  std::unique_ptr<tls_session> s;
  try {
    s = std::make_unique<tls_session>(ctx_, tcp_fd, tls_session::role::client);
    s->read_ahead();  // the pump reads until EAGAIN before it polls
    s->handshake(deadline);
  } catch (const error& e) {
    s.reset();
    ::close(tcp_fd);
    throw error(e.code(), who_ + ": TLS with " + where + ": " + e.message());
  }
  return start(tcp_fd, std::move(s), where, false, deadline);
}

int tls_relays::accept(int tcp_fd, std::chrono::milliseconds handshake_bound) {
  std::unique_ptr<tls_session> s;
  try {
    s = std::make_unique<tls_session>(ctx_, tcp_fd, tls_session::role::server);
    s->read_ahead();  // the pump reads until EAGAIN before it polls
  } catch (const error&) {
    ::close(tcp_fd);
    throw;
  }
  return start(tcp_fd, std::move(s), peer_address(tcp_fd), true, clock::now() + handshake_bound);
}

std::string tls_relays::refusal(int plain_fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto it = refusals_.find(plain_fd);
  return it == refusals_.end() ? std::string() : it->second;
}

}  // namespace troupe::detail
