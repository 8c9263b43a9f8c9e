#pragma once
/// \file env_process_group.hpp
/// A process group from the launcher environment in one call, like torch's
/// init_process_group("env://"). troupe-run, or any launcher, sets RANK, WORLD_SIZE,
/// MASTER_ADDR, MASTER_PORT and TROUPE_JOB_TOKEN. Every rank constructs an env_process_group.
///
///   troupe::ddp::env_process_group dist;           // joins the job, forms the group
///   dist.group().allreduce(t).wait();
///   dist.shutdown();                               // waits for every rank, then leaves
///
/// It owns what the group needs: the runtime node (its store is the rendezvous; rank 0 hosts
/// it) and the group itself. The group goes first, then the node. The group records its
/// collectives in the node's flight recorder unless the options name another.

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "troupe/actors/node.hpp"
#include "troupe/actors/node_options.hpp"
#include "troupe/ddp/hierarchical_group.hpp"
#include "troupe/ddp/process_group.hpp"

namespace troupe::ddp {

/// A runtime node and the process group of all its job's ranks. Move-only RAII.
class env_process_group {
 public:
  /// Reads the launcher variables (node_options::from_env), starts the node and forms the
  /// group `name` over every rank. Blocks up to the node's join_timeout plus opts.timeout.
  /// Throws bad_argument (an unparsable variable, RANK outside [0, WORLD_SIZE)), what the node
  /// throws (unauthorized, timeout, peer_lost, io_error) and what the group throws (timeout).
  explicit env_process_group(std::string name = "default", process_group_options opts = {});
  /// The same from explicit node options (e.g. from_env() with some fields overridden). When
  /// opts.tcp_address is left at loopback, the TCP transport listens on node.listen_addr.
  env_process_group(node_options node, std::string name, process_group_options opts = {});
  /// Destroys the group, then shuts the node down at once (shutdown() was not called: ranks
  /// still using the store may fail). Never throws.
  ~env_process_group();
  env_process_group(env_process_group&&) noexcept;
  env_process_group& operator=(env_process_group&&) noexcept;
  env_process_group(const env_process_group&) = delete;
  env_process_group& operator=(const env_process_group&) = delete;

  /// The group of every rank for the common collectives (what DDP takes): make_cpu_group's
  /// choice. That is a hierarchical_group when the job spans hosts with several ranks on some
  /// host, unless opts.transport names a transport. Otherwise it is the process group. Throws
  /// invalid_state after shutdown().
  collective_group& collectives();
  /// The process group of every rank (every collective, send/recv, new_group): the
  /// hierarchical group's flat TCP group when collectives() is one. Throws invalid_state after
  /// shutdown().
  process_group& group();
  /// The runtime node (RPC, store, worker list). Throws invalid_state after shutdown().
  troupe::node& node();
  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }

  /// A subgroup through the node's store: process_group::new_group (every rank calls it).
  std::optional<process_group> new_group(std::vector<int> ranks, process_group_options opts = {});

  /// Destroys the group, then leaves the job gracefully: waits until every rank reached
  /// shutdown (up to `timeout`; errc::timeout names the missing ranks, after tearing down).
  /// Idempotent.
  void shutdown(std::chrono::milliseconds timeout = std::chrono::seconds(30));

 private:
  std::unique_ptr<troupe::node> node_;
  std::unique_ptr<collective_group> group_;
  process_group* flat_ = nullptr;  // group_ itself, or its flat group
  process_group_options opts_;
  int rank_ = 0;
  int world_size_ = 1;
};

}  // namespace troupe::ddp
