#include "launcher/channel.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <thread>

#include "launcher/line_socket.hpp"
#include "tls_relay.hpp"
#include "troupe/actors/host_address.hpp"
#include "troupe/actors/tls_context.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::launcher {

struct channel_join {
  int node_rank = -1;
  int nproc = 0;
  std::string host;
};

using clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct channel::peer {
  int fd = -1;
  std::string buf;
  int node_rank = 0;
  std::string host;
  bool done = false;
  bool open = true;

  void close() {
    if (fd >= 0) ::close(fd);
    fd = -1;
    open = false;
  }
};

namespace {

constexpr const char* tls_hint = "give every launcher of the job --tls-cert, --tls-key and --tls-ca (or TROUPE_TLS_*), or none";

int ms_left(clock::time_point deadline, int cap) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, cap));
}

}  // namespace

channel::channel() = default;
channel::channel(channel&& o) noexcept { *this = std::move(o); }
channel& channel::operator=(channel&& o) noexcept {
  std::swap(master_, o.master_);
  std::swap(listen_fd_, o.listen_fd_);
  std::swap(store_port_, o.store_port_);
  std::swap(done_, o.done_);
  std::swap(ended_, o.ended_);
  std::swap(attempt_, o.attempt_);
  std::swap(peers_, o.peers_);
  std::swap(tls_, o.tls_);
  return *this;
}
channel::~channel() {
  for (auto& p : peers_) p.close();
  if (tls_) tls_->drain(std::chrono::seconds(2));  // the last lines (end, stop) still go out
  tls_.reset();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void channel::start_tls(const launch_options& o, const std::string& who) {
  const tls_options t{o.tls_cert, o.tls_key, o.tls_ca};
  if (t.enabled()) tls_ = std::make_unique<detail::tls_relays>(who, make_tls_context(t));
}

// Master: accepts one connection; under TLS the plain end of its relay (the handshake runs on
// the relay thread; a refused peer is logged there and reads as closed). -1 when none.
int channel::accept_one(clock::time_point deadline) {
  const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | (tls_ ? SOCK_NONBLOCK : 0));  // a relay's is non-blocking
  if (fd < 0 || !tls_) return fd;
  try {
    return tls_->accept(fd, milliseconds(std::max(ms_left(deadline, 10000), 1)));
  } catch (const error& e) {
    std::fprintf(stderr, "troupe-run: %s\n", e.what());
    return -1;
  }
}

// Node: why the master closed the connection before the job started.
std::string channel::why_closed(int fd, const std::string& received) const {
  if (tls_)
    if (const std::string why = tls_->refusal(fd); !why.empty()) return "refused this launcher's TLS certificate: " + why;
  if (!tls_ && looks_like_tls(received)) return std::string("answered in TLS, and this launcher has none: ") + tls_hint;
  return std::string("closed the connection before the job started") + (tls_ ? "" : std::string(" (if it uses TLS: ") + tls_hint + ")");
}

namespace {

// Checks one join line; returns the refusal's reason, or empty when `p` may join.
std::string check_join(const launch_options& o, const std::string& line, channel_join& j) {
  std::istringstream in(line);
  std::string word, token;
  in >> word >> token >> j.node_rank >> j.nproc >> j.host;
  if (word != "join" || !in) return "malformed join";
  if (token != o.token) return "the job token differs from the master's (pass the same --job-token or TROUPE_JOB_TOKEN everywhere)";
  if (j.node_rank <= 0 || j.node_rank >= o.nnodes)
    return "node rank " + std::to_string(j.node_rank) + " is outside [1, " + std::to_string(o.nnodes) + ")";
  if (j.nproc != o.nproc)
    return "--nproc-per-node " + std::to_string(j.nproc) + " differs from the master's " + std::to_string(o.nproc);
  return {};
}

std::string missing_nodes(int nnodes, const std::vector<int>& joined) {
  std::string out;
  for (int k = 1; k < nnodes; ++k)
    if (std::find(joined.begin(), joined.end(), k) == joined.end()) out += (out.empty() ? "" : ", ") + std::to_string(k);
  return out;
}

}  // namespace

channel channel::serve(const launch_options& o, const std::string& bind_addr, const std::string& /*host*/) {
  channel ch;
  ch.master_ = true;
  ch.start_tls(o, "troupe-run node 0");
  ch.listen_fd_ = listen_on(bind_addr, o.master_port);
  const auto deadline = clock::now() + std::chrono::seconds(o.join_timeout_s);
  std::vector<peer> pending;
  std::vector<int> joined;
  while (static_cast<int>(ch.peers_.size()) < o.nnodes - 1) {
    if (clock::now() >= deadline)
      throw error(errc::timeout, "only " + std::to_string(ch.peers_.size() + 1) + " of " + std::to_string(o.nnodes) +
                                     " nodes joined within " + std::to_string(o.join_timeout_s) + " s (missing node ranks " +
                                     missing_nodes(o.nnodes, joined) + ")");
    std::vector<pollfd> fds{pollfd{ch.listen_fd_, POLLIN, 0}};
    for (auto& p : pending) fds.push_back(pollfd{p.fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), ms_left(deadline, 200));
    if (fds[0].revents & POLLIN)
      if (const int fd = ch.accept_one(deadline); fd >= 0) {
        pending.emplace_back();
        pending.back().fd = fd;
        pending.back().host = peer_address(fd);
      }
    for (std::size_t i = 0; i < pending.size(); ++i) {
      auto& p = pending[i];
      if (!(fds.size() > i + 1 && fds[i + 1].revents)) continue;
      if (!read_some(p.buf, p.fd)) {
        p.close();
        continue;
      }
      if (!ch.tls_ && looks_like_tls(p.buf)) {
        std::fprintf(stderr, "troupe-run: refused a launcher from %s: it speaks TLS and this launcher has none (%s)\n", p.host.c_str(), tls_hint);
        p.close();
        continue;
      }
      const auto line = take_line(p.buf);
      if (!line) continue;
      channel_join j;
      std::string why = check_join(o, *line, j);
      if (why.empty() && std::find(joined.begin(), joined.end(), j.node_rank) != joined.end())
        why = "node rank " + std::to_string(j.node_rank) + " joined already";
      if (!why.empty()) {
        send_line(p.fd, "refuse " + why);
        p.close();
        continue;
      }
      p.node_rank = j.node_rank;
      p.host = j.host;
      joined.push_back(j.node_rank);
      ch.peers_.push_back(std::move(p));
      p.fd = -1;
      p.open = false;
    }
    std::erase_if(pending, [](const peer& p) { return !p.open; });
  }
  for (auto& p : pending) p.close();
  return ch;
}

channel channel::join(const launch_options& o, const std::string& host) {
  channel ch;
  ch.start_tls(o, "troupe-run node " + std::to_string(o.node_rank));
  const auto deadline = clock::now() + std::chrono::seconds(o.join_timeout_s);
  const sockaddr_in master = ipv4(o.master_addr, o.master_port);
  const std::string where = o.master_addr + ":" + std::to_string(o.master_port);
  int fd = -1;
  for (auto backoff = milliseconds(20); (fd = connect_once(master)) < 0;) {
    if (clock::now() + backoff >= deadline)
      throw error(errc::timeout, "the master launcher at " + where + " did not answer within " + std::to_string(o.join_timeout_s) +
                                     " s: " + std::strerror(errno));
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, milliseconds(500));
  }
  if (ch.tls_) {
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    try {
      fd = ch.tls_->connect(fd, where, deadline);  // closes fd on failure
    } catch (const error& e) {
      std::string why = e.message();
      const std::string prefix = "troupe-run node " + std::to_string(o.node_rank) + ": TLS with " + where + ": ";
      if (why.rfind(prefix, 0) == 0) why = why.substr(prefix.size());
      throw error(e.code() == errc::timeout ? errc::timeout : errc::unauthorized,
                  "no TLS connection with the master launcher at " + where + ": " + why +
                      (e.code() == errc::peer_lost ? std::string(" (the master may have no TLS: ") + tls_hint + ")" : ""));
    }
  }
  ch.peers_.emplace_back();
  ch.peers_.back().fd = fd;
  ch.peers_.back().host = o.master_addr;
  auto& m = ch.peers_.front();
  send_line(fd, "join " + o.token + " " + std::to_string(o.node_rank) + " " + std::to_string(o.nproc) + " " + host);
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms_left(deadline, 200)) == 1 && !read_some(m.buf, fd)) {
      const std::string why = ch.why_closed(fd, m.buf);
      throw error(why.rfind("closed", 0) == 0 ? errc::peer_lost : errc::unauthorized, "the master launcher at " + where + " " + why);
    }
    if (const auto line = take_line(m.buf)) {
      if (line->rfind("start ", 0) == 0) {
        ch.store_port_ = std::stoi(line->substr(6));
        return ch;
      }
      throw error(errc::unauthorized, "the master launcher at " + where + " refused node " + std::to_string(o.node_rank) + ": " +
                                          (line->rfind("refuse ", 0) == 0 ? line->substr(7) : *line));
    }
    if (clock::now() >= deadline)
      throw error(errc::timeout, "the job did not start within " + std::to_string(o.join_timeout_s) + " s (other nodes missing?)");
  }
}

void channel::start(int store_port) {
  store_port_ = store_port;
  broadcast("start " + std::to_string(store_port), nullptr);
}

void channel::broadcast(const std::string& line, const peer* except) {
  for (auto& p : peers_)
    if (&p != except && p.open) send_line(p.fd, line);
}

void channel::report_failure(const std::string& what) {
  if (master_) broadcast("stop " + what, nullptr);
  else broadcast("fail " + std::to_string(attempt_) + " " + what, nullptr);
}

void channel::restart(int store_port) {
  ++attempt_;
  store_port_ = store_port;
  done_ = false;
  for (auto& p : peers_) p.done = false;
  broadcast("restart " + std::to_string(attempt_) + " " + std::to_string(store_port), nullptr);
}

void channel::adopt(const event& e) {
  attempt_ = e.attempt;
  store_port_ = e.store_port;
  done_ = false;
}

void channel::mark_done() {
  done_ = true;
  if (master_) end_if_all_done();
  else broadcast("done " + std::to_string(attempt_), nullptr);
}

void channel::end_if_all_done() {
  if (!done_ || ended_ || !std::all_of(peers_.begin(), peers_.end(), [](const peer& p) { return p.done; })) return;
  broadcast("end", nullptr);
  ended_ = true;
}

std::optional<channel::event> channel::next_event(milliseconds timeout) {
  std::vector<pollfd> fds;
  for (auto& p : peers_) fds.push_back(pollfd{p.open ? p.fd : -1, POLLIN, 0});
  if (::poll(fds.data(), fds.size(), static_cast<int>(timeout.count())) <= 0) return std::nullopt;
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    auto& p = peers_[i];
    if (!fds[i].revents || !p.open) continue;
    const bool alive = read_some(p.buf, p.fd);
    while (const auto line = take_line(p.buf))
      if (auto e = on_line(p, *line)) return e;
    if (!alive)
      if (auto e = on_lost(p)) return e;
  }
  return std::nullopt;
}

namespace {

// The attempt number at the start of `rest` and the text after it; attempt -1 when malformed.
std::pair<int, std::string> split_attempt(const std::string& rest) {
  std::size_t used = 0;
  int a = -1;
  try {
    a = std::stoi(rest, &used);
  } catch (const std::exception&) {
    return {-1, rest};
  }
  return {a, used < rest.size() ? rest.substr(used + 1) : std::string()};
}

}  // namespace

std::optional<channel::event> channel::on_line(peer& p, const std::string& line) {
  using kind = event::kind;
  if (master_ && line.rfind("fail ", 0) == 0) {
    const auto [a, what] = split_attempt(line.substr(5));
    if (a != attempt_) return std::nullopt;  // stale: that attempt was restarted already
    return event{kind::failed, what, attempt_, 0};
  }
  if (!master_ && line.rfind("stop ", 0) == 0) return event{kind::stop, line.substr(5), attempt_, 0};
  if (!master_ && line.rfind("restart ", 0) == 0) {
    const auto [a, port] = split_attempt(line.substr(8));
    if (a > attempt_) return event{kind::restart, "", a, std::atoi(port.c_str())};
    return std::nullopt;
  }
  if (master_ && line.rfind("done ", 0) == 0 && split_attempt(line.substr(5)).first == attempt_) {
    p.done = true;
    end_if_all_done();
  }
  if (!master_ && line == "end") ended_ = true;
  return std::nullopt;
}

std::optional<channel::event> channel::on_lost(peer& p) {
  p.close();
  if (ended_ || p.done) return std::nullopt;
  if (!master_) return event{event::kind::stop, "the master launcher (node 0 at " + p.host + ") was lost", attempt_, 0};
  const std::string what = "the launcher of node " + std::to_string(p.node_rank) + " on host " + p.host + " was lost";
  broadcast("stop " + what, &p);
  return event{event::kind::stop, what, attempt_, 0};
}

}  // namespace troupe::launcher
