#pragma once
// The gate in front of a node's CAF port (Note [CAF port gate]).
//
// Note [CAF port gate]
//
// CAF 0.17's BASP broker trusts the first header on a connection. A client handshake announcing
// a 4 GiB payload makes it allocate 4 GiB before anything is checked. So no
// unauthenticated byte reaches CAF. The node's CAF port is a Troupe listener (the gate); the
// middleman listens nowhere. A connecting node first sends a gate hello and waits for the verdict:
//
//   client --"TRPG" u16 length, job token--> gate: token ok?  --'Y'--> client
//   both sides hand the socket to their BASP broker: the gate's side as a published actor's
//   connection (the agent; CAF writes the server handshake), the client's side as a connect
//   (CAF writes the client handshake and answers with the agent's handle).
//   wrong token: --'N'-->, closed, logged on both sides (the client throws unauthorized).
//
// Before the verdict, the gate reads at most the hello from a connection: 6 bytes and a token of
// up to max_gate_token bytes. So nothing unauthenticated makes the node allocate more. The
// bounds of Note [connection hygiene] apply: a deadline, a cap, backoff when accept fails. An
// existing link is never touched by what a new connection sends. The job token is compared in
// constant time. The agent's hello (Note [job token]) still checks the token and the identity.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "rpc/accept_guard.hpp"
#include "tls_relay.hpp"

namespace troupe::detail {

/// The longest job token the gate hello carries.
inline constexpr std::size_t max_gate_token = 1024;

struct caf_gate_config {
  std::string who;  ///< the node's worker name, for stderr
  std::string listen_addr;
  std::uint16_t port = 0;  ///< 0: ephemeral
  std::string token;
  std::chrono::milliseconds auth_deadline{2000};
  std::size_t max_unauthenticated = 64;
  /// Note [tls relay]: with TLS, every accepted connection goes through a relay; null: plain TCP.
  std::shared_ptr<tls_relays> tls;
};

/// One node's gate. The gate thread accepts, reads hellos and hands admitted sockets over.
class caf_gate {
 public:
  /// Listens on cfg.listen_addr:cfg.port (SO_REUSEADDR); throws io_error. `admit` takes each
  /// admitted socket (on the gate thread; it owns the fd from then on).
  caf_gate(caf_gate_config cfg, std::function<void(int fd)> admit);
  ~caf_gate();
  caf_gate(const caf_gate&) = delete;
  caf_gate& operator=(const caf_gate&) = delete;

  void start();
  /// Closes the listener and every waiting connection, joins the thread. Idempotent.
  void stop();
  std::uint16_t port() const { return port_; }

  /// Client side: connects to host:port and presents `token`; returns the admitted socket,
  /// ready for the BASP broker. Blocks up to `timeout`. With `tls`, the connection is TLS (Note
  /// [tls relay]). Throws unauthorized (the gate refused the token, or TLS refused a certificate)
  /// or peer_lost (no gate there, closed, or no verdict in time).
  static int enter(const std::string& host, std::uint16_t port, const std::string& token, std::chrono::milliseconds timeout,
                   tls_relays* tls = nullptr);

 private:
  struct waiting {
    int fd;
    std::chrono::steady_clock::time_point deadline;
    std::vector<char> got;  ///< the hello so far (at most 6 + max_gate_token bytes)
  };
  void run();
  void accept_all();
  /// Reads what `w` sent; true when `w` is finished with (admitted or refused: fd given or closed).
  bool on_readable(waiting& w);
  void expire();

  caf_gate_config cfg_;
  std::function<void(int)> admit_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::uint16_t port_ = 0;
  accept_guard accept_;
  std::vector<waiting> waiting_;  // oldest first (gate thread)
  std::thread thread_;
  std::atomic<bool> stopping_{false};
};

}  // namespace troupe::detail
