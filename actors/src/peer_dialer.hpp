#pragma once
// How a node reaches another node's agent: through the peer's gate, over CAF, with a hello.
//
// Note [CAF connect tick]
//
// CAF 0.17.6's BASP broker keeps a pending connect in a context whose last_seen is the clock's
// epoch until the peer's first bytes arrive. Its heartbeat tick drops every context not seen
// within connection_timeout. So a connect fails with connection_timeout when the peer's server
// handshake comes after the next tick, though the peer is alive. The tick comes 0 to
// heartbeat_interval after the dial: a slow peer (a fresh process, a loaded host) meets it now
// and then. connect() dials again after any failure; connect_once() after this one.
//   us --gate hello--> peer --admitted--> us --client handshake--> peer
//   our tick: pending context "last seen" at the epoch --> connection_timeout
//   peer --server handshake--> (too late: the socket is closed)
//
// Note [hello retry]
//
// Two nodes that dial each other at the same moment open two CAF connections. CAF 0.17's BASP
// broker keeps one per side and closes the other as redundant. Each side may pick a different
// one, and a message already sent on a connection the other side closes is lost. A hello lost
// that way would wait out its whole deadline. So a hello gets a short timeout of its own
// (500 ms, doubling). A hello that times out or finds no route dials again and says hello
// again, until the deadline. By then the redundant connection is gone and the second hello
// takes the one that stays. A hello is idempotent on the peer: it admits the same node again
// and issues a fresh ticket for the direct connection. A refused hello (unauthorized) is final.
//   A --dial--> B    A <--dial-- B     (both at once)
//   A --hello--X (its connection closed by B)
//   A --dial--> B --hello--> B --ack--> A   (the retry, within the same deadline)
//
// Note [greeted peers]
//
// A peer that said hello to us already shares a CAF connection with us. Our hello to it goes
// over that connection: we do not dial. A dial there would add a redundant connection, which
// the peer's broker keeps as an alternative route until ours closes it. CAF 0.17.6 loses
// messages there. Its routing table moves a node's route to any remaining alternative when
// one alternative closes, so with two alternatives open it may pick the one about to close.
// The messages sent on it (a store request, say) vanish, and the node is never reported
// down. Every rank greets rank 0 at start-up, so rank 0 never dials a rank. A hello over the
// known connection that fails falls back to a dial.
//   B --hello--> A         (B started, or B reached A first)
//   A --hello--> B's agent (no dial: the connection B opened)

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "rpc/bulk.hpp"
#include "tls_relay.hpp"
#include "troupe/actors/messages.hpp"
#include "troupe/actors/worker_info.hpp"

namespace troupe::detail {

struct peer_dialer_config {
  caf::actor_system* sys = nullptr;
  worker_info me;
  std::string token;             ///< the job token, for the gate and the hello
  caf::actor agent;              ///< ours: the hello names it
  caf::actor basp;               ///< the middleman's BASP broker: dialled sockets go to it
  std::shared_ptr<bulk_names> bulk;  ///< its probe travels in the hello (Note [shm reachability])
  tls_relays* tls = nullptr;     ///< Note [tls relay]; null: plain TCP
};

/// Dials peers and says hello to their agents (see the notes). Thread-safe; every call is bounded
/// by its timeout.
class peer_dialer {
 public:
  explicit peer_dialer(peer_dialer_config cfg) : cfg_(std::move(cfg)) {}

  /// Says hello to the agent at host:port and returns its answer (Note [hello retry]). `peer`:
  /// the worker's name when known; its agent, when it greeted us, takes our hello first (Note
  /// [greeted peers]). `once`: the peer was lost before, so each dial is connect_once (Note
  /// [lost peer re-admission] in troupe/actors/peer_events.hpp). Throws unauthorized (the token
  /// or the identity was refused, final) or peer_lost naming the address and why.
  hello_ack greet(const std::string& peer, const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout, bool once);
  /// Peer `peer` said hello to us; `agent` is its agent. Agent thread; never blocks.
  void greeted(const std::string& peer, const caf::actor& agent);
  /// Forgets the connection of a peer gone down (or of every peer, at teardown).
  void forget(const std::string& peer);
  void forget_all();

 private:
  // A failed dial: why, and whether the peer's gate admitted us (a live process answered).
  struct dial_failure {
    std::string why;
    bool admitted = false;
  };
  hello_ack say_hello(const caf::actor& remote, std::chrono::milliseconds timeout);
  caf::actor attempt(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout, dial_failure& failed);
  caf::actor connect(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout);
  caf::actor connect_once(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout);
  caf::actor greeted_by(const std::string& peer);

  peer_dialer_config cfg_;
  std::mutex mutex_;
  std::map<std::string, caf::actor> greeted_;  // under mutex_: peers that said hello -> their agent
};

}  // namespace troupe::detail
