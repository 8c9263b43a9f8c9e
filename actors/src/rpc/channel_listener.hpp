#pragma once
// The accepting side of the direct channel (Note [direct channel] in rpc/direct_channel.hpp).
// It holds the listening socket and the bounds on connections that have not authenticated
// (Note [connection hygiene] in rpc/accept_guard.hpp). It also holds the one-use tickets that
// let a connection in.
//
//   agent: issue_ticket(peer) -> secret --CAF, after the job token--> peer
//   peer: connect --channel_auth{name, secret}--> I/O thread: redeem(secret, name) -> peer, node
//
// A ticket is used once; unredeemed tickets beyond max_tickets are dropped, oldest first.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <caf/node_id.hpp>

#include "rpc/accept_guard.hpp"
#include "rpc/channel_conn.hpp"

namespace troupe::detail {

class tls_relays;

/// The direct channel's listener. Tickets are thread-safe; the rest belongs to the I/O thread.
class channel_listener {
 public:
  using clock = std::chrono::steady_clock;
  /// Whom a ticket was issued to.
  struct ticket {
    std::string peer;
    caf::node_id node;
  };
  /// Listens on `addr` (ephemeral port); throws io_error naming `who`. `tls` (may be null):
  /// every accepted connection goes through a relay (Note [tls relay]).
  channel_listener(const std::string& who, const std::string& addr, std::chrono::milliseconds auth_deadline,
                   std::size_t max_unauthenticated, std::shared_ptr<tls_relays> tls);
  ~channel_listener();
  channel_listener(const channel_listener&) = delete;
  channel_listener& operator=(const channel_listener&) = delete;

  std::uint16_t port() const { return port_; }
  /// The socket to poll now: -1 while accepting backs off.
  int poll_fd(clock::time_point now) const { return accept_.accepting(now) ? fd_ : -1; }
  /// When the I/O thread must look again: the first auth deadline, the end of a backoff, or `bound`.
  clock::time_point next(clock::time_point bound) const;
  /// Accepts every pending connection into `fresh`; `evicted` gets the oldest waiting ones past
  /// the cap (the caller drops them).
  void accept_all(std::vector<std::shared_ptr<channel_conn>>& fresh, std::vector<std::shared_ptr<channel_conn>>& evicted);
  /// Fills `late` with the waiting connections past their auth deadline (the caller drops them).
  void expire(std::vector<std::shared_ptr<channel_conn>>& late);

  /// A fresh one-use secret for `peer`.
  std::string issue_ticket(const std::string& peer, const caf::node_id& node);
  /// Uses the ticket of `secret` if it was issued to `name`: true and `out` set.
  bool redeem(const std::string& secret, const std::string& name, ticket& out);
  /// Drops every ticket.
  void clear_tickets();

 private:
  std::chrono::milliseconds auth_deadline_;
  std::size_t max_unauthenticated_;
  std::shared_ptr<tls_relays> tls_;
  int fd_ = -1;
  std::uint16_t port_ = 0;
  accept_guard accept_;
  // Accepted connections that have not authenticated, oldest first, with their deadlines
  // (entries that authenticated or closed since are skipped).
  std::deque<std::pair<clock::time_point, std::weak_ptr<channel_conn>>> waiting_;
  std::mutex tickets_mutex_;
  std::map<std::string, ticket> tickets_;  // secret -> issued for
};

}  // namespace troupe::detail
