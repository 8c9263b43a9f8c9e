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
//   fail <rank, host, cause>        ->   a rank of node k failed
//                                 <- stop <rank, host, cause>   to every other node
//   done                            ->   every rank of node k exited with 0
//                                 <- end                  once every node is done
//
// A launcher whose connection breaks before `end` is a failure too: the master stops the others
// naming the lost node and its host; a node that loses the master stops its ranks. So a failure
// anywhere stops the job on every host, and every launcher prints who failed, where and why.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "launcher/launch_options.hpp"

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

  /// Waits up to `timeout` for a failure elsewhere; returns its text, or nullopt. Never throws.
  std::optional<std::string> failure(std::chrono::milliseconds timeout);
  /// Tells every other launcher that this node failed (`what` names rank, host and cause).
  void report_failure(const std::string& what);
  /// This node's ranks all succeeded. The job has ended once every node is done (ended()).
  void mark_done();
  /// True once every node's ranks succeeded.
  bool ended() const { return ended_; }

 private:
  struct peer;
  channel();
  std::optional<std::string> on_line(peer& p, const std::string& line);
  std::optional<std::string> on_lost(peer& p);
  void end_if_all_done();
  void broadcast(const std::string& line, const peer* except);

  bool master_ = false;
  int listen_fd_ = -1;
  int store_port_ = 0;
  bool done_ = false;
  bool ended_ = false;
  std::vector<peer> peers_;  // master: one per other node; node: the master
};

}  // namespace troupe::launcher
