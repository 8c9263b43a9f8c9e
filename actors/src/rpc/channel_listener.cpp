// The direct channel's listener (rpc/channel_listener.hpp).
#include "rpc/channel_listener.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "tls_relay.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::detail {

namespace {

// Tickets nobody redeemed (a caller that never connected) are dropped beyond this many.
constexpr std::size_t max_tickets = 4096;

std::string random_secret() {
  std::random_device rd;
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 8; ++i) {
    const auto v = rd();
    for (int k = 0; k < 8; ++k) s += hex[(v >> (4 * k)) & 0xf];
  }
  return s;
}

// The IPv4 address of `host` (a dotted quad or a name).
bool resolve_ipv4(const std::string& host, in_addr& out) {
  if (::inet_pton(AF_INET, host.c_str(), &out) == 1) return true;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return false;
  out = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return true;
}

bool settled(const std::weak_ptr<channel_conn>& w) {
  auto c = w.lock();
  return !c || c->authed || c->closed();
}

}  // namespace

channel_listener::channel_listener(const std::string& who, const std::string& addr, std::chrono::milliseconds auth_deadline,
                                   std::size_t max_unauthenticated, std::shared_ptr<tls_relays> tls)
    : auth_deadline_(auth_deadline), max_unauthenticated_(max_unauthenticated), tls_(std::move(tls)), accept_(who, "direct rpc") {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  socklen_t len = sizeof sa;
  if (fd_ < 0 || !resolve_ipv4(addr, sa.sin_addr) || ::bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      ::listen(fd_, 64) != 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    throw error(errc::io_error, who + ": cannot listen for direct rpc on " + addr + ": " + why);
  }
  port_ = ntohs(sa.sin_port);
}

channel_listener::~channel_listener() { ::close(fd_); }

channel_listener::clock::time_point channel_listener::next(clock::time_point bound) const {
  if (!waiting_.empty()) bound = std::min(bound, waiting_.front().first);
  if (!accept_.accepting(clock::now())) bound = std::min(bound, accept_.resume_at());
  return bound;
}

// Note [connection hygiene] (rpc/accept_guard.hpp).
void channel_listener::accept_all(std::vector<std::shared_ptr<channel_conn>>& fresh, std::vector<std::shared_ptr<channel_conn>>& evicted) {
  for (;;) {
    int fd = accept_.accept_one(fd_);
    if (fd < 0) return;
    if (tls_) {  // Note [tls relay]: the handshake runs on the relay; the auth frame is read from its plain end
      try {
        fd = tls_->accept(fd, auth_deadline_);
      } catch (const error& e) {
        accept_.refused(e.message().c_str());
        continue;
      }
    }
    auto c = std::make_shared<channel_conn>(fd, false);
    std::erase_if(waiting_, [](const auto& w) { return settled(w.second); });
    if (waiting_.size() >= std::max<std::size_t>(max_unauthenticated_, 1)) {
      if (auto oldest = waiting_.front().second.lock()) evicted.push_back(std::move(oldest));
      waiting_.pop_front();
      accept_.closed_waiting(false);
    }
    waiting_.emplace_back(clock::now() + auth_deadline_, c);
    fresh.push_back(std::move(c));
  }
}

void channel_listener::expire(std::vector<std::shared_ptr<channel_conn>>& late) {
  const auto now = clock::now();
  while (!waiting_.empty()) {
    const bool done = settled(waiting_.front().second);
    if (!done && waiting_.front().first > now) return;
    auto c = waiting_.front().second.lock();
    waiting_.pop_front();
    if (done) continue;
    late.push_back(std::move(c));
    accept_.closed_waiting(true);
  }
}

std::string channel_listener::issue_ticket(const std::string& peer, const caf::node_id& node) {
  auto secret = random_secret();
  std::lock_guard<std::mutex> lock(tickets_mutex_);
  if (tickets_.size() >= max_tickets) tickets_.erase(tickets_.begin());
  tickets_[secret] = ticket{peer, node};
  return secret;
}

bool channel_listener::redeem(const std::string& secret, const std::string& name, ticket& out) {
  std::lock_guard<std::mutex> lock(tickets_mutex_);
  auto it = tickets_.find(secret);
  if (it == tickets_.end() || it->second.peer != name) return false;
  out = std::move(it->second);
  tickets_.erase(it);  // one use
  return true;
}

void channel_listener::clear_tickets() {
  std::lock_guard<std::mutex> lock(tickets_mutex_);
  tickets_.clear();
}

}  // namespace troupe::detail
