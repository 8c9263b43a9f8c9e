#pragma once
// A node's links to its peers: for each worker, its agent and the direct connection for calls.
//
// Note [one connect per peer]
//
// A link is made on the first call to a worker. The worker's address comes from the store; a
// hello through peer_dialer admits us, and the direct channel connects with the hello's ticket.
// Threads that resolve the same new peer at once take turns on its mutex. The first connects,
// the others find its link. Two concurrent BASP connections to one node make CAF keep one, and
// a hello sent over the other is lost. Two processes that dial each other at once can lose a
// hello the same way (Note [hello retry] in peer_dialer.hpp).
//   resolve(name) --store_get("troupe/addr/<name>")--> host:port
//                 --greet(host, port)--> hello_ack{agent, channel_port, secret}
//                 --channel connect(secret)--> link{agent, conn}   (kept until the peer is lost)
//
// A peer seen going down is dropped and remembered with the reason. The next call to it takes
// one bounded window, not the start-up retries (Note [lost peer re-admission] in
// troupe/actors/peer_events.hpp). So it fails at once when the peer is really gone, and
// reconnects if it was only a dropped connection.

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "peer_dialer.hpp"
#include "rpc/bulk.hpp"
#include "rpc/direct_channel.hpp"
#include "troupe/actors/messages.hpp"
#include "troupe/actors/worker_info.hpp"

namespace troupe::detail {

/// A peer: its agent (hello, monitor) and the direct connection that carries every call.
struct peer_link {
  caf::actor agent;
  std::shared_ptr<channel_conn> conn;
};

struct peer_links_config {
  caf::actor_system* sys = nullptr;
  worker_info me;
  std::string listen_addr;  ///< where this node's channel listens (calls to itself)
  /// The window of a re-admission: connection_timeout, at least 1 s.
  std::chrono::milliseconds readmit_window{1000};
  caf::actor agent;  ///< ours: it monitors each linked peer's agent
  std::shared_ptr<bulk_names> bulk;
  std::shared_ptr<direct_channel> channel;
  peer_dialer* dialer = nullptr;
  /// The worker's published "host:port" from the store; throws as the store does.
  std::function<std::string(const std::string& worker, std::chrono::milliseconds timeout)> address_of;
  /// The worker that hosts the store: a lost store host has no newer address.
  std::function<std::string()> store_host;
};

/// The links of one node (see the note). Thread-safe.
class peer_links {
 public:
  explicit peer_links(peer_links_config cfg) : cfg_(std::move(cfg)) {}

  /// The link to worker `name`, made on first use (bounded by `timeout`). This node's own name
  /// gives a connection to its own channel. Throws timeout (another thread's connect took
  /// longer), peer_lost (unreachable, or lost and not answering), unauthorized.
  peer_link resolve(const std::string& name, std::chrono::milliseconds timeout);
  /// Links the peer that answered `ack` at `host` (the node's join: the store host).
  void add(const hello_ack& ack, const std::string& host, std::chrono::milliseconds timeout);
  /// The peer went down: its link is dropped and the reason kept for its re-admission.
  void lose(const std::string& name, const std::string& reason);
  /// The workers linked now.
  std::vector<std::string> names();
  /// Drops every link (teardown).
  void clear();

 private:
  peer_link make_link(const hello_ack& ack, const std::string& host, std::chrono::milliseconds timeout);
  hello_ack readmit(const std::string& name, std::string& addr, const std::string& lost_because, std::chrono::milliseconds timeout);
  peer_link self_link(std::chrono::milliseconds timeout);

  peer_links_config cfg_;
  std::mutex mutex_;
  std::map<std::string, peer_link> peers_;  // under mutex_
  std::map<std::string, std::string> lost_;  // under mutex_: peers seen going down -> why
  std::map<std::string, std::shared_ptr<std::timed_mutex>> connecting_;  // under mutex_: Note [one connect per peer]
  std::mutex self_mutex_;
  std::optional<peer_link> to_self_;  // under self_mutex_: the connection for calls to this node
};

}  // namespace troupe::detail
