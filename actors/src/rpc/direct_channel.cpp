// The direct RPC channel: listening, the I/O thread, connections, tickets and timers
// (Note [direct channel] in rpc/direct_channel.hpp). The call side is in channel_calls.cpp.
#include "rpc/direct_channel.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "rpc/dial.hpp"
#include "rpc/split_frame.hpp"
#include "rpc/wire.hpp"
#include "tls_relay.hpp"

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


}  // namespace

direct_channel::direct_channel(direct_channel_config cfg) : cfg_(std::move(cfg)), accept_(cfg_.me.name, "direct rpc") {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  socklen_t len = sizeof addr;
  if (listen_fd_ < 0 || !resolve_ipv4(cfg_.listen_addr, addr.sin_addr) ||
      ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 64) != 0 ||
      ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string why = std::strerror(errno);
    if (listen_fd_ >= 0) ::close(listen_fd_);
    throw error(errc::io_error, cfg_.me.name + ": cannot listen for direct rpc on " + cfg_.listen_addr + ": " + why);
  }
  port_ = ntohs(addr.sin_port);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  lead_wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
}

direct_channel::~direct_channel() {
  stop();
  ::close(listen_fd_);
  ::close(wake_fd_);
  ::close(lead_wake_fd_);
}

void direct_channel::start() {
  io_ = std::thread([this] { run(); });
  cfg_.exec->set_source(this);
}

void direct_channel::wake() {
  const std::uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(wake_fd_, &one, sizeof one);
}

void direct_channel::interrupt() {
  lead_interrupted_.store(true);
  const std::uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(lead_wake_fd_, &one, sizeof one);
}

void direct_channel::lead(led_jobs& jobs) {
  if (conns_gen_.load(std::memory_order_acquire) != led_gen_) {  // the connections changed: list them again
    std::lock_guard<std::mutex> lock(conns_mutex_);
    led_conns_.clear();
    for (auto& c : conns_)
      if (c->led) led_conns_.push_back(c);
    led_gen_ = conns_gen_.load(std::memory_order_relaxed);
  }
  const auto& polled = led_conns_;
  // Note [blocking first read]: one connection and no interrupt pending: wait in its recv.
  if (polled.size() == 1 && !lead_interrupted_.load()) {
    const auto& c = polled.front();
    const auto before = c->bytes_read.load(std::memory_order_relaxed);
    on_readable(c, &jobs, true);
    if (c->bytes_read.load(std::memory_order_relaxed) != before || c->closed()) return;
  }
  std::vector<pollfd> fds{pollfd{lead_wake_fd_, POLLIN, 0}};
  for (auto& c : polled) fds.push_back(pollfd{c->fd(), POLLIN, 0});
  if (::poll(fds.data(), fds.size(), max_poll_ms) <= 0) return;
  if (fds[0].revents) {
    lead_interrupted_.store(false);
    std::uint64_t n = 0;
    [[maybe_unused]] auto r = ::read(lead_wake_fd_, &n, sizeof n);
  }
  for (std::size_t i = 0; i < polled.size(); ++i)
    if (fds[i + 1].revents) on_readable(polled[i], &jobs);
}

std::string direct_channel::issue_ticket(const std::string& peer, const caf::node_id& node) {
  auto secret = random_secret();
  std::lock_guard<std::mutex> lock(conns_mutex_);
  if (tickets_.size() >= max_tickets) tickets_.erase(tickets_.begin());
  tickets_[secret] = ticket{peer, node};
  return secret;
}

std::shared_ptr<channel_conn> direct_channel::connect(const std::string& peer, const caf::node_id& node, const std::string& host,
                                              std::uint16_t port, const std::string& secret, bool shm_ok, std::chrono::milliseconds timeout) {
  int fd = dial_tcp(host, port, timeout);
  if (fd < 0) throw error(errc::peer_lost, cfg_.me.name + ": cannot open the direct rpc connection to " + peer + " at " + host + ":" + std::to_string(port));
  if (cfg_.tls) fd = cfg_.tls->connect(fd, "the direct rpc port of " + peer + " at " + host + ":" + std::to_string(port), clock::now() + timeout);
  auto c = std::make_shared<channel_conn>(fd, true);
  c->waiter = make_waiter(c);
  c->peer = peer;
  c->peer_node = node;
  std::vector<char> frame;
  channel_auth auth{cfg_.me.name, secret, shm_ok};
  if (!append_frame(frame, frame_kind::auth, auth) || !c->write(frame.data(), frame.size()))
    throw error(errc::peer_lost, cfg_.me.name + ": the direct rpc connection to " + peer + " failed during authentication");
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    if (stopping_) throw error(errc::invalid_state, cfg_.me.name + " is shutting down");
    conns_.push_back(c);
    conns_gen_.fetch_add(1, std::memory_order_release);
  }
  wake();  // the I/O thread polls the new connection from now on
  return c;
}

void direct_channel::stop() {
  if (stopping_.exchange(true)) return;
  cfg_.exec->set_source(nullptr);  // no executor thread leads on our sockets from now on
  led_conns_.clear();
  wake();
  if (io_.joinable()) io_.join();
  std::vector<std::shared_ptr<channel_conn>> conns;
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    conns.swap(conns_);
    conns_gen_.fetch_add(1, std::memory_order_release);
    tickets_.clear();
  }
  for (auto& c : conns) c->close();
  writer_.stop();  // queued large writes fail at once on the closed connections
  {
    std::lock_guard<std::mutex> lock(timers_mutex_);
    timers_.clear();
  }
  std::unordered_map<std::uint64_t, pending_call> left;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    left.swap(pending_);
    deadlines_.clear();
  }
  for (auto& [id, p] : left)
    p.state->complete(errc::invalid_state, p.state->what() + ": node " + cfg_.me.name + " shut down", {});
}

void direct_channel::peer_down(const std::string& peer, const std::string& reason) {
  std::vector<std::shared_ptr<channel_conn>> gone;
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    for (auto& c : conns_)
      if (c->peer == peer) gone.push_back(c);
  }
  for (auto& c : gone) {
    c->close();
    fail_calls_on(c.get(), peer, reason);
    notify_lost(c, reason);
    // Note [tensor over shared memory]: what the peer held is freed when no local tensor views it.
    if (cfg_.bulk && c->peer_node) cfg_.bulk->drop_peer(caf::to_string(c->peer_node));
  }
}

void direct_channel::drop(const std::shared_ptr<channel_conn>& c, const std::string& why) {
  c->close();
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    std::erase(conns_, c);
    conns_gen_.fetch_add(1, std::memory_order_release);
  }
  if (c->outgoing()) fail_calls_on(c.get(), c->peer, why);
  notify_lost(c, why);
}

void direct_channel::later(std::chrono::milliseconds delay, std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(timers_mutex_);
    timers_.emplace(clock::now() + delay, std::move(fn));
  }
  wake();
}

void direct_channel::run_timers() {
  for (;;) {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(timers_mutex_);
      if (timers_.empty() || timers_.begin()->first > clock::now()) return;
      fn = std::move(timers_.begin()->second);
      timers_.erase(timers_.begin());
    }
    fn();
  }
}

int direct_channel::poll_timeout_ms() {
  auto next = clock::now() + std::chrono::milliseconds(max_poll_ms);
  {
    std::lock_guard<std::mutex> lock(timers_mutex_);
    if (!timers_.empty()) next = std::min(next, timers_.begin()->first);
  }
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    if (!deadlines_.empty()) next = std::min(next, deadlines_.begin()->first);
  }
  if (!waiting_.empty()) next = std::min(next, waiting_.front().first);
  if (!accept_.accepting(clock::now())) next = std::min(next, accept_.resume_at());
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, max_poll_ms));
}

// Note [connection hygiene] (rpc/accept_guard.hpp).
void direct_channel::accept_all() {
  for (;;) {
    int fd = accept_.accept_one(listen_fd_);
    if (fd < 0) return;
    if (cfg_.tls) {  // Note [tls relay]: the handshake runs on the relay; the auth frame is read from its plain end
      try {
        fd = cfg_.tls->accept(fd, cfg_.auth_deadline);
      } catch (const error& e) {
        accept_.refused(e.message().c_str());
        continue;
      }
    }
    auto c = std::make_shared<channel_conn>(fd, false);
    std::erase_if(waiting_, [](const auto& w) {
      auto l = w.second.lock();
      return !l || l->authed || l->closed();
    });
    if (waiting_.size() >= std::max<std::size_t>(cfg_.max_unauthenticated, 1)) {
      if (auto oldest = waiting_.front().second.lock()) drop(oldest, "unauthenticated beyond the cap");
      waiting_.pop_front();
      accept_.closed_waiting(false);
    }
    waiting_.emplace_back(clock::now() + cfg_.auth_deadline, c);
    std::lock_guard<std::mutex> lock(conns_mutex_);
    conns_.push_back(std::move(c));
    conns_gen_.fetch_add(1, std::memory_order_release);
  }
}

void direct_channel::expire_waiting() {
  const auto now = clock::now();
  while (!waiting_.empty()) {
    auto c = waiting_.front().second.lock();
    const bool done = !c || c->authed || c->closed();
    if (!done && waiting_.front().first > now) return;
    waiting_.pop_front();
    if (done) continue;
    drop(c, "did not authenticate in time");
    accept_.closed_waiting(true);
  }
}

void direct_channel::run() {
  std::vector<pollfd> fds;
  std::vector<std::shared_ptr<channel_conn>> polled, outgoing;
  while (!stopping_) {
    {
      std::lock_guard<std::mutex> lock(conns_mutex_);
      polled.clear();
      for (auto& c : conns_)
        if (!c->led) polled.push_back(c);  // the executor's leader reads the others
    }
    outgoing.clear();
    std::copy_if(polled.begin(), polled.end(), std::back_inserter(outgoing), [](const auto& c) { return c->outgoing(); });
    std::erase_if(polled, [&](const auto& c) { return !io_reads(*c); });  // a waiting caller reads it
    // Note [connection hygiene]: the listener is not polled while accepting backs off.
    fds.assign({pollfd{wake_fd_, POLLIN, 0}, pollfd{accept_.accepting(clock::now()) ? listen_fd_ : -1, POLLIN, 0}});
    for (auto& c : polled) fds.push_back(pollfd{c->fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), poll_timeout_ms()) < 0 && errno != EINTR) break;
    if (fds[0].revents) {
      std::uint64_t n = 0;
      [[maybe_unused]] auto r = ::read(wake_fd_, &n, sizeof n);
    }
    if (fds[1].revents) accept_all();
    for (std::size_t i = 0; i < polled.size(); ++i)
      if (fds[i + 2].revents) {
        if (polled[i]->outgoing()) read_for_io(polled[i]);
        else on_readable(polled[i], nullptr);
      }
    expire_waiting();
    run_timers();
    sweep_deadlines();
    read_unwaited(outgoing);
    if (cfg_.bulk) cfg_.bulk->sweep_pins();  // Note [tensor over shared memory]: shared tensors mapped by now
  }
}

void direct_channel::on_readable(const std::shared_ptr<channel_conn>& c, job_list* jobs, bool block_first) {
  const std::uint64_t before = c->bytes_read.load(std::memory_order_relaxed);
  // Note [connection hygiene]: before its auth frame, a connection is read one frame's worth.
  const auto budget = [&] { return c->outgoing() || c->authed ? max_read_bytes : frame_header_size + max_auth_body; };
  bool open = c->read_available(block_first, budget());
  for (;;) {
    // Note [direct fragment data]: a fragment read straight into its stream comes before the
    // bytes read after it.
    if (c->streams.direct_done()) {
      fragment_streams::assembled a;
      if (c->streams.finish_direct(a) == fragment_streams::result::complete && !on_assembled(c, std::move(a), jobs)) {
        if (!c->closed()) drop_malformed(c);
        return;
      }
    }
    if (!parse_frames(c, jobs)) return;
    // Read on while a fragment's data goes straight into its stream and the budget of one round
    // (max_read_bytes, Note [fragments]) is not used up.
    if (!open || !c->more_to_read || c->bytes_read.load(std::memory_order_relaxed) - before >= max_read_bytes) break;
    open = c->read_available(false, budget());
  }
  if (!open) return drop(c, "connection closed");
  if (c->authed && !c->outgoing() && !c->led) {  // hand the connection (and its buffer) to the leader
    {
      std::lock_guard<std::mutex> lock(conns_mutex_);
      c->led = true;
      conns_gen_.fetch_add(1, std::memory_order_release);
    }
    interrupt();
  }
}

bool direct_channel::parse_frames(const std::shared_ptr<channel_conn>& c, job_list* jobs) {
  std::size_t at = 0;
  auto& in = c->in;
  while (in.size() - at >= frame_header_size) {
    const std::uint32_t len = frame_length(in.data() + at);
    // Before its ticket, a connection may send one small auth frame and nothing else: judge the
    // header at once rather than wait for a body a scanner announced.
    const bool unauthenticated = !c->outgoing() && !c->authed;
    if (len > (unauthenticated ? max_auth_body : max_body()) ||
        (unauthenticated && in[at + 4] != static_cast<char>(frame_kind::auth))) {
      std::fprintf(stderr, "[troupe] %s: dropped a direct rpc connection: bad frame header\n", cfg_.me.name.c_str());
      drop(c, "protocol violation: bad frame header");
      return false;
    }
    const auto kind = static_cast<std::uint8_t>(in[at + 4]);
    const std::size_t have = in.size() - at - frame_header_size;
    if (have < len) {
      // Note [direct fragment data]: a later fragment's data straight into its stream, a large
      // request's or response's payload straight into its buffer.
      const auto want = static_cast<std::uint8_t>(c->outgoing() ? frame_kind::response : frame_kind::request);
      const bool fragment = kind == static_cast<std::uint8_t>(frame_kind::fragment) && have >= fragment_head_size;
      const bool large = kind == want && len >= split_payload_bytes;
      if ((fragment || large) && c->streams.direct_left() == 0) {
        const char* body = in.data() + at + frame_header_size;
        const auto r = fragment ? c->streams.start_direct(body, have, len, want, max_body())
                                : c->streams.start_frame(body, have, len, want, cfg_.bulk ? &cfg_.bulk->buffers() : nullptr);
        if (r == fragment_streams::result::malformed) {
          drop_malformed(c);
          return false;
        }
        if (r == fragment_streams::result::partial) {
          at = in.size();
          break;
        }
      }
      // A large frame arriving in pieces: room for all of it now, not one doubling after another
      // (each a copy of what came so far); read_available then fills it in large reads.
      if (in.capacity() < at + frame_header_size + len) in.reserve(at + frame_header_size + len);
      break;
    }
    if (!handle_frame(c, kind, in.data() + at + frame_header_size, len, jobs)) return false;
    at += frame_header_size + len;
  }
  in.erase(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(at));
  return true;
}

void direct_channel::drop_malformed(const std::shared_ptr<channel_conn>& c) {
  std::fprintf(stderr, "[troupe] %s: dropped the direct rpc connection of %s: malformed frame\n", cfg_.me.name.c_str(), c->peer.c_str());
  drop(c, "protocol violation: malformed frame");
}

bool direct_channel::on_auth(const std::shared_ptr<channel_conn>& c, const char* body, std::size_t n) {
  channel_auth a;
  bool ok = parse_body(body, n, a);
  if (ok) {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    auto it = tickets_.find(a.secret);
    ok = it != tickets_.end() && it->second.peer == a.name;
    if (ok) {
      c->peer = it->second.peer;
      c->peer_node = it->second.node;
      tickets_.erase(it);  // one use
      if (cfg_.bulk) cfg_.bulk->set_reachable(caf::to_string(c->peer_node), a.shm_ok);  // Note [shm reachability]
    }
  }
  if (!ok) {
    std::fprintf(stderr, "[troupe] %s: refused a direct rpc connection: no valid ticket\n", cfg_.me.name.c_str());
    drop(c, "unauthenticated");
    return false;
  }
  c->authed = true;
  return true;
}

bool direct_channel::handle_frame(const std::shared_ptr<channel_conn>& c, std::uint8_t kind, const char* body, std::size_t n, job_list* jobs) {
  if (!c->outgoing() && !c->authed) {
    if (kind == static_cast<std::uint8_t>(frame_kind::auth)) return on_auth(c, body, n);
    std::fprintf(stderr, "[troupe] %s: refused a direct rpc connection that did not authenticate first\n", cfg_.me.name.c_str());
    drop(c, "unauthenticated");
    return false;
  }
  if (kind == static_cast<std::uint8_t>(frame_kind::actor) || kind == static_cast<std::uint8_t>(frame_kind::actor_control)) {
    on_actor_frame(c, kind == static_cast<std::uint8_t>(frame_kind::actor_control), body, n);  // Note [remote actors]
    return true;
  }
  if (kind == static_cast<std::uint8_t>(frame_kind::fragment)) {
    if (on_fragment(c, body, n, jobs)) return true;
    if (c->closed()) return false;  // dropped for the inner frame, which said why
  } else if (!c->outgoing() && kind == static_cast<std::uint8_t>(frame_kind::request)) {
    rpc_request req;
    if (n >= byte_pool_min_bytes && cfg_.bulk) cfg_.bulk->buffers().reserve(req.payload, n);  // Note [byte pool]
    if (n >= split_payload_bytes ? parse_split_body(body, n, req) : parse_body(body, n, req)) {
      on_request(c, std::move(req), jobs);
      return true;
    }
  } else if (c->outgoing() && kind == static_cast<std::uint8_t>(frame_kind::response)) {
    rpc_response resp;
    if (n >= byte_pool_min_bytes && cfg_.bulk) cfg_.bulk->buffers().reserve(resp.payload, n);  // Note [byte pool]
    if (n >= split_payload_bytes ? parse_split_body(body, n, resp) : parse_body(body, n, resp)) {
      on_response(c, std::move(resp));
      return true;
    }
  }
  drop_malformed(c);
  return false;
}

}  // namespace troupe::detail

namespace troupe::detail {

// Note [fragments] (rpc/fragment.hpp). False: malformed (the caller drops the connection), or
// the inner frame dropped it.
bool direct_channel::on_fragment(const std::shared_ptr<channel_conn>& c, const char* body, std::size_t n, job_list* jobs) {
  const auto want = static_cast<std::uint8_t>(c->outgoing() ? frame_kind::response : frame_kind::request);
  fragment_streams::assembled a;
  switch (c->streams.add(body, n, want, cfg_.bulk ? &cfg_.bulk->buffers() : nullptr, a, max_body())) {
    case fragment_streams::result::partial:
      return true;
    case fragment_streams::result::complete:
      return on_assembled(c, std::move(a), jobs);
    default:
      return false;
  }
}

bool direct_channel::on_assembled(const std::shared_ptr<channel_conn>& c, fragment_streams::assembled&& a, job_list* jobs) {
  if (a.head.empty()) {  // the whole body in one buffer
    const bool ok = handle_frame(c, a.inner, a.rest.data(), a.rest.size(), jobs);
    if (cfg_.bulk) cfg_.bulk->buffers().give(std::move(a.rest));
    return ok;
  }
  // The buffer the fragments were put together in becomes the payload (no copy).
  if (a.inner == static_cast<std::uint8_t>(frame_kind::request)) {
    rpc_request req;
    if (!parse_split_parts(a.head, std::move(a.rest), req)) return false;
    on_request(c, std::move(req), jobs);
  } else {
    rpc_response resp;
    if (!parse_split_parts(a.head, std::move(a.rest), resp)) return false;
    on_response(c, std::move(resp));
  }
  return true;
}

}  // namespace troupe::detail
