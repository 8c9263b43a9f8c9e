// The gate in front of a node's CAF port (Note [CAF port gate] in caf_gate.hpp).
#include "caf_gate.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "rpc/dial.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::detail {

namespace {

using clock = std::chrono::steady_clock;
constexpr char magic[4] = {'T', 'R', 'P', 'G'};
constexpr std::size_t head_size = 6;  // magic, u16 token length (big-endian)
constexpr char admitted = 'Y';
constexpr char refused = 'N';
constexpr int max_poll_ms = 200;

bool same_token(const char* a, std::size_t n, const std::string& b) {
  unsigned char diff = n == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<std::size_t>(b.size(), 1)]);
  return diff == 0;
}

int ms_left(clock::time_point end) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(end - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30));
}


}  // namespace

caf_gate::caf_gate(caf_gate_config cfg, std::function<void(int)> admit)
    : cfg_(std::move(cfg)), admit_(std::move(admit)), accept_(cfg_.who, "CAF port") {
  if (cfg_.token.size() > max_gate_token)
    throw error(errc::bad_argument, cfg_.who + ": the job token is longer than " + std::to_string(max_gate_token) + " bytes");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(cfg_.port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  bool resolved = ::inet_pton(AF_INET, cfg_.listen_addr.c_str(), &addr.sin_addr) == 1;
  if (!resolved && ::getaddrinfo(cfg_.listen_addr.c_str(), nullptr, &hints, &res) == 0 && res) {
    addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    resolved = true;
  }
  if (res) ::freeaddrinfo(res);
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const int one = 1;
  socklen_t len = sizeof addr;
  if (listen_fd_ < 0 || !resolved || ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 128) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = resolved ? std::strerror(errno) : "cannot resolve the address";
    if (listen_fd_ >= 0) ::close(listen_fd_);
    throw error(errc::io_error, cfg_.who + ": cannot listen on " + cfg_.listen_addr + ":" + std::to_string(cfg_.port) + ": " + why);
  }
  port_ = ntohs(addr.sin_port);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

caf_gate::~caf_gate() {
  stop();
  ::close(listen_fd_);
  ::close(wake_fd_);
}

void caf_gate::start() { thread_ = std::thread([this] { run(); }); }

void caf_gate::stop() {
  if (stopping_.exchange(true)) return;
  const std::uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(wake_fd_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  for (auto& w : waiting_) ::close(w.fd);
  waiting_.clear();
}

void caf_gate::run() {
  std::vector<pollfd> fds;
  while (!stopping_) {
    const auto now = clock::now();
    fds.assign({pollfd{wake_fd_, POLLIN, 0}, pollfd{accept_.accepting(now) ? listen_fd_ : -1, POLLIN, 0}});
    auto next = now + std::chrono::milliseconds(max_poll_ms);
    if (!accept_.accepting(now)) next = std::min(next, accept_.resume_at());
    for (const auto& w : waiting_) {
      fds.push_back(pollfd{w.fd, POLLIN, 0});
      next = std::min(next, w.deadline);
    }
    if (::poll(fds.data(), fds.size(), ms_left(next)) < 0 && errno != EINTR) break;
    if (fds[0].revents) {
      std::uint64_t n = 0;
      [[maybe_unused]] auto r = ::read(wake_fd_, &n, sizeof n);
    }
    // Read the polled connections first (accepting may evict and so reorder waiting_).
    std::vector<int> finished;
    for (std::size_t i = 2; i < fds.size(); ++i)
      if (fds[i].revents) {
        auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const waiting& w) { return w.fd == fds[i].fd; });
        if (it != waiting_.end() && on_readable(*it)) it->fd = -1;
      }
    std::erase_if(waiting_, [](const waiting& w) { return w.fd < 0; });
    if (fds[1].revents) accept_all();
    expire();
  }
}

// Note [connection hygiene] (rpc/accept_guard.hpp).
void caf_gate::accept_all() {
  for (;;) {
    int fd = accept_.accept_one(listen_fd_);
    if (fd < 0) return;
    if (cfg_.tls) {  // Note [tls relay]: the handshake runs on the relay; the hello is read from its plain end
      try {
        fd = cfg_.tls->accept(fd, cfg_.auth_deadline);
      } catch (const error& e) {
        accept_.refused(e.message().c_str());
        continue;
      }
    }
    if (waiting_.size() >= std::max<std::size_t>(cfg_.max_unauthenticated, 1)) {
      ::close(waiting_.front().fd);
      waiting_.erase(waiting_.begin());
      accept_.closed_waiting(false);
    }
    waiting_.push_back(waiting{fd, clock::now() + cfg_.auth_deadline, {}});
  }
}

void caf_gate::expire() {
  const auto now = clock::now();
  std::erase_if(waiting_, [&](const waiting& w) {
    if (w.deadline > now) return false;
    ::close(w.fd);
    accept_.closed_waiting(true);
    return true;
  });
}

bool caf_gate::on_readable(waiting& w) {
  // Read exactly what the hello still lacks: what follows it belongs to CAF.
  const std::size_t want = w.got.size() < head_size
                               ? head_size
                               : head_size + ((static_cast<std::size_t>(static_cast<unsigned char>(w.got[4])) << 8) |
                                              static_cast<unsigned char>(w.got[5]));
  const std::size_t at = w.got.size();
  w.got.resize(want);
  const ssize_t k = ::recv(w.fd, w.got.data() + at, want - at, MSG_DONTWAIT);
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    w.got.resize(at);
    return false;
  }
  if (k <= 0) {
    ::close(w.fd);
    return true;
  }
  w.got.resize(at + static_cast<std::size_t>(k));
  if (w.got.size() == head_size) {
    const std::size_t n = (static_cast<std::size_t>(static_cast<unsigned char>(w.got[4])) << 8) | static_cast<unsigned char>(w.got[5]);
    if (std::memcmp(w.got.data(), magic, sizeof magic) != 0 || n > max_gate_token) {
      accept_.refused("a connection that sent no gate hello (not a Troupe node, or a scanner)");
      ::close(w.fd);
      return true;
    }
    if (n > 0) return false;  // the token follows
  }
  if (w.got.size() < head_size || w.got.size() < want) return false;
  const bool ok = same_token(w.got.data() + head_size, w.got.size() - head_size, cfg_.token);
  const char verdict = ok ? admitted : refused;
  const bool told = ::send(w.fd, &verdict, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1;
  if (!ok || !told) {
    if (!ok) accept_.refused("a connection with a wrong job token");
    ::close(w.fd);
    return true;
  }
  admit_(w.fd);
  return true;
}

int caf_gate::enter(const std::string& host, std::uint16_t port, const std::string& token, std::chrono::milliseconds timeout,
                    tls_relays* tls) {
  const auto end = clock::now() + timeout;
  const std::string where = host + ":" + std::to_string(port);
  if (token.size() > max_gate_token) throw error(errc::bad_argument, "the job token is longer than " + std::to_string(max_gate_token) + " bytes");
  int fd = dial_tcp(host, port, std::chrono::milliseconds(ms_left(end)));
  if (fd < 0) throw error(errc::peer_lost, "cannot connect to " + where);
  if (tls) fd = tls->connect(fd, where, end);
  std::string hello(magic, sizeof magic);
  hello += static_cast<char>((token.size() >> 8) & 0xff);
  hello += static_cast<char>(token.size() & 0xff);
  hello += token;
  char verdict = 0;
  pollfd p{fd, POLLIN, 0};
  const bool sent = ::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(hello.size());
  const bool heard = sent && ::poll(&p, 1, ms_left(end)) == 1 && ::recv(fd, &verdict, 1, MSG_DONTWAIT) == 1;
  if (heard && verdict == admitted) return fd;
  const std::string refusal = tls && !heard ? tls->refusal(fd) : std::string();
  ::close(fd);
  if (!refusal.empty()) throw error(errc::unauthorized, "the node at " + where + " refused this node's TLS certificate: " + refusal);
  if (heard && verdict == refused) throw error(errc::unauthorized, "the node at " + where + " refused the job token");
  throw error(errc::peer_lost, "no gate verdict from " + where + (sent ? "" : " (the hello could not be sent)"));
}

}  // namespace troupe::detail
