#pragma once
// The launchers of a multi-node job talk over one TCP connection each to the master's launcher
// (Note [launcher channel]).
//
// Note [launcher channel]
// The master's launcher (node rank 0) listens on --master-port. Every other launcher connects
// (retrying until --join-timeout-s) and joins with the job token; a launcher with another token,
// another --nproc-per-node or a node rank already taken is refused. When every node joined, the
// master picks the store's port and starts the job everywhere. Lines of text, one message each:
//
//   node k                          master (node 0)
//   join <token> <k> <nproc> <host> ->
//                                 <- start <store port>   (or: refuse <why>)
//   fail <attempt> <rank, host, cause> ->  a rank of node k failed in that attempt
//                                 <- stop <rank, host, cause>   to every other node
//                                 <- restart <attempt> <store port>   (restarts left)
//   done <attempt>                  ->   every rank of node k exited with 0
//                                 <- end                  once every node is done
//
// TLS is configured by --tls-* or TROUPE_TLS_*, the files the ranks use. With it, every
// connection of the channel is mutual TLS through the nodes' relays (Note [tls relay] in
// actors/src/tls_relay.hpp). The join line, and so the token, goes out only after both
// certificates verified. The master refuses a launcher that speaks no TLS or whose certificate
// its CA did not sign. It logs the peer's address and OpenSSL's reason, closes that connection
// and keeps waiting for the job's nodes. A launcher refused so fails with a message that says
// why: the master's certificate, its own, or TLS on one side only. A master without TLS refuses
// a launcher that speaks TLS.
//
// A launcher whose connection breaks before `end` is a failure too. The master stops the others
// naming the lost node and its host. A node that loses the master stops its ranks. So a failure
// anywhere stops the job on every host, and every launcher prints who failed, where and why.
//
// Note [job restart]
// The master holds the job's restart budget (--max-restarts, given to the master). A failure in
// attempt n, on any node, reaches the master; the first one of attempt n decides. With restarts
// left, the master picks a new store port and sends `restart n+1 <port>` to every node. Each
// launcher stops its ranks and starts them again with TROUPE_RESTART_COUNT = n+1. Later failures
// of attempt n (ranks that lost their peers) are stale and ignored, so the budget goes down once
// per job restart, not once per rank or host. Without restarts left the master sends `stop`. A
// lost launcher is never restarted: its host is gone, so the job stops.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launcher/launch_options.hpp"

namespace troupe::detail {
class tls_relays;
}

namespace troupe::launcher {

/// One launcher's end of the channel. Move-only; closes its sockets.
class channel {
 public:
  /// Master: binds `bind_addr`:o.master_port, waits (bounded by o.join_timeout_s) until every
  /// other node joined, then returns. Throws troupe::error naming the nodes that did not join.
  static channel serve(const launch_options& o, const std::string& bind_addr, const std::string& host);
  /// Other nodes: connects to the master and joins (bounded by o.join_timeout_s); returns once
  /// the master started the job. Throws troupe::error when refused or when the master is absent.
  static channel join(const launch_options& o, const std::string& host);

  channel(channel&&) noexcept;
  channel& operator=(channel&&) noexcept;
  channel(const channel&) = delete;
  channel& operator=(const channel&) = delete;
  ~channel();

  /// Master: tells every node the store's port. Node: the port the master sent.
  void start(int store_port);
  int store_port() const { return store_port_; }

  /// What the channel says about the job: another node failed (master: a restart or stop is
  /// to be decided), the job stops, or the job restarts as `attempt` on `store_port`.
  struct event {
    enum class kind { failed, stop, restart } what = kind::stop;
    std::string text;
    int attempt = 0;
    int store_port = 0;
  };

  /// Waits up to `timeout` for news from the other launchers; nullopt when none. Never throws.
  std::optional<event> next_event(std::chrono::milliseconds timeout);
  /// Node: tells the master that this node failed in the current attempt. Master: tells every
  /// node that the job stops (`what` names rank, host and cause).
  void report_failure(const std::string& what);
  /// Master: starts the next attempt on every node with the store at `store_port`.
  void restart(int store_port);
  /// Node: adopts the attempt the master ordered (after a restart event).
  void adopt(const event& e);
  /// The attempt in progress (0 first).
  int attempt() const { return attempt_; }
  /// This node's ranks all succeeded. The job has ended once every node is done (ended()).
  void mark_done();
  /// True once every node's ranks succeeded.
  bool ended() const { return ended_; }

 private:
  struct peer;
  channel();
  std::optional<event> on_line(peer& p, const std::string& line);
  std::optional<event> on_lost(peer& p);
  void end_if_all_done();
  void broadcast(const std::string& line, const peer* except);

  void start_tls(const launch_options& o, const std::string& who);
  int accept_one(std::chrono::steady_clock::time_point deadline);
  std::string why_closed(int fd, const std::string& received) const;

  std::unique_ptr<detail::tls_relays> tls_;  // null without TLS; its connections end after peers_
  bool master_ = false;
  int listen_fd_ = -1;
  int store_port_ = 0;
  bool done_ = false;
  bool ended_ = false;
  int attempt_ = 0;
  std::vector<peer> peers_;  // master: one per other node; node: the master
};

}  // namespace troupe::launcher
