// A node's links to its peers (Note [one connect per peer] in peer_links.hpp).
#include "peer_links.hpp"

#include <algorithm>

#include <caf/all.hpp>

#include "rpc/agent.hpp"

namespace troupe::detail {

namespace {
// "host:port", as a node publishes its address in the store, split in two.
std::pair<std::string, std::uint16_t> split_address(const std::string& addr) {
  const auto colon = addr.rfind(':');
  return {addr.substr(0, colon), static_cast<std::uint16_t>(std::stoi(addr.substr(colon + 1)))};
}
}  // namespace

// A peer we said hello to: its agent and the direct connection for our calls. Ours monitors its
// agent from now on, so the heartbeat sees a frozen peer. A peer whose direct channel cannot be
// reached is not linked: resolve() throws peer_lost naming it.
peer_link peer_links::make_link(const hello_ack& ack, const std::string& host, std::chrono::milliseconds timeout) {
  peer_link l{ack.agent, nullptr};
  caf::anon_send(cfg_.agent, watch_peer_msg{ack.agent, ack.info.name});
  // Note [shm reachability]: the peer told us whether it can open our memory. We tell it whether
  // we can open its, ahead of our first request on either path. This message precedes our
  // agent's calls to its agent, and the direct connection's auth frame precedes our requests on
  // it.
  bool ours = false;
  if (same_host(ack.agent.node(), cfg_.sys->node())) {
    cfg_.bulk->set_reachable(caf::to_string(ack.agent.node()), ack.shm_ok);
    ours = cfg_.bulk->shared_memory_enabled() && can_open_probe(ack.shm);
    caf::send_as(cfg_.agent, ack.agent, shm_verdict{ours});
  }
  if (ack.channel_port == 0) throw error(errc::peer_lost, "worker " + ack.info.name + " has no direct channel");
  l.conn = cfg_.channel->connect(ack.info.name, ack.agent.node(), host, ack.channel_port, ack.channel_secret, ours, timeout);
  return l;
}

void peer_links::add(const hello_ack& ack, const std::string& host, std::chrono::milliseconds timeout) {
  auto l = make_link(ack, host, timeout);
  std::lock_guard<std::mutex> lock(mutex_);
  peers_[ack.info.name] = std::move(l);
}

peer_link peer_links::resolve(const std::string& name, std::chrono::milliseconds timeout) {
  if (name == cfg_.me.name) return self_link(timeout);
  std::shared_ptr<std::timed_mutex> turn;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = peers_.find(name);
    if (it != peers_.end()) return it->second;
    auto& t = connecting_[name];
    if (!t) t = std::make_shared<std::timed_mutex>();
    turn = t;
  }
  // Note [one connect per peer]
  std::unique_lock<std::timed_mutex> my_turn(*turn, std::defer_lock);
  if (!my_turn.try_lock_for(timeout))
    throw error(errc::timeout, cfg_.me.name + ": connecting to worker " + name + " took longer than " + std::to_string(timeout.count()) + " ms");
  std::optional<std::string> lost_because;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = peers_.find(name);
    if (it != peers_.end()) return it->second;
    if (auto l = lost_.find(name); l != lost_.end()) lost_because = l->second;
  }
  auto addr = cfg_.address_of(name, timeout);
  hello_ack ack;
  if (lost_because) {
    ack = readmit(name, addr, *lost_because, timeout);
  } else {
    const auto [host, peer_port] = split_address(addr);
    ack = cfg_.dialer->greet(name, host, peer_port, timeout, false);  // Note [hello retry]
  }
  auto l = make_link(ack, split_address(addr).first, timeout);
  std::lock_guard<std::mutex> lock(mutex_);
  peers_[name] = l;
  lost_.erase(name);
  return l;
}

// Note [lost peer re-admission]: a peer lost before gets one bounded window, not the start-up
// retries. So a call to a dead peer fails at once. A dial that fails is made again at the
// store's newer address when a replacement published one after `addr` was read (`addr` then
// names it). The window: readmit_window, at most `timeout`.
hello_ack peer_links::readmit(const std::string& name, std::string& addr, const std::string& lost_because, std::chrono::milliseconds timeout) {
  using clock = std::chrono::steady_clock;
  const auto end = clock::now() + std::min(timeout, cfg_.readmit_window);
  auto left = [&] { return std::max(std::chrono::duration_cast<std::chrono::milliseconds>(end - clock::now()), std::chrono::milliseconds(1)); };
  for (;;) {
    std::string why;
    try {
      const auto [host, peer_port] = split_address(addr);
      return cfg_.dialer->greet({}, host, peer_port, left(), true);
    } catch (const error& e) {
      if (e.code() == errc::unauthorized) throw;
      why = e.message();
    }
    std::string newer;
    if (name != cfg_.store_host() && clock::now() < end) {  // a lost store host has no newer address
      try {
        newer = cfg_.address_of(name, left());
      } catch (const error&) {  // the store is unreachable: the dial's failure is the answer
      }
    }
    if (newer.empty() || newer == addr)
      throw error(errc::peer_lost, "worker " + name + " was lost (" + lost_because + ") and does not answer at " + addr + ": " + why);
    addr = std::move(newer);
  }
}

// Calls to this node take a direct connection to its own channel. So they keep every guarantee
// of a call between nodes (deadline, hook, executor) on the one path. Made on first use.
peer_link peer_links::self_link(std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(self_mutex_);  // held across the connect: a loopback connect is quick
  if (to_self_ && !to_self_->conn->closed()) return *to_self_;
  const bool wildcard = cfg_.listen_addr == "0.0.0.0" || cfg_.listen_addr.empty();
  const auto host = wildcard ? std::string("127.0.0.1") : cfg_.listen_addr;
  auto& channel = *cfg_.channel;
  const auto node = cfg_.sys->node();
  peer_link l{cfg_.agent, channel.connect(cfg_.me.name, node, host, channel.port(), channel.issue_ticket(cfg_.me.name, node),
                                          cfg_.bulk->shared_memory_enabled(), timeout)};
  to_self_ = l;
  return l;
}

void peer_links::lose(const std::string& name, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  peers_.erase(name);
  lost_[name] = reason;
}

std::vector<std::string> peer_links::names() {
  std::vector<std::string> names;
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [name, l] : peers_) names.push_back(name);
  return names;
}

void peer_links::clear() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    peers_.clear();
  }
  std::lock_guard<std::mutex> lock(self_mutex_);
  to_self_.reset();
}

}  // namespace troupe::detail
