#pragma once
/// \file hierarchical_group.hpp
/// A CPU collective group over several hosts with several ranks on each, and the factory that
/// picks it. It uses shared memory within a host and TCP between hosts (Note [hierarchical
/// allreduce]).
///
/// Note [hierarchical allreduce]
/// -----------------------------
/// The ranks are split by host identity (host name and boot id, published in the store). Each
/// host's ranks form a shared-memory group ("<name>-l<host>"). The first rank of each host, its
/// leader, joins a TCP group of the leaders ("<name>-x"). Every rank joins a TCP group of all
/// ranks ("<name>-f", the flat group). An allreduce runs in three steps:
///
///   reduce to the leader (shared memory) --> allreduce among leaders (TCP ring, one rank per
///   host crosses the network) --> broadcast from the leader (shared memory)
///
/// avg sums in both steps and divides by the world size at the end (integer dtypes take the
/// flat group, whose division truncates). Every rank of a host copies its leader's result, and
/// the TCP ring gives every leader the same bytes, so the result is bitwise identical on every
/// rank. broadcast, allgather, reduce_scatter and the barriers run on the flat group. One worker
/// thread runs the collectives in issue order, each step waiting on the sub-group's work.
///
/// Failure: the group watches every member through the node's peer-loss events (Note [group
/// peer loss]). A lost member breaks every sub-group with peer_lost naming the lost rank, its
/// host and that host's ranks. So every survivor fails within the node's connection timeout,
/// whichever step it waits in. A step that fails breaks the other sub-groups with its error, so
/// ranks waiting for their leader do not wait for the timeout. The group is broken afterwards.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "troupe/ddp/collective_group.hpp"
#include "troupe/ddp/process_group.hpp"

namespace troupe {
class store_client;
}

namespace troupe::ddp {

/// A collective_group of `world_size` ranks on several hosts (Note [hierarchical allreduce]).
/// Move-only.
class hierarchical_group : public collective_group {
 public:
  /// Rendezvous through `store` (every rank calls it; blocks up to a few times opts.timeout).
  /// opts.tcp_address must be this host's address (as for a TCP process_group); opts.transport
  /// is ignored. Throws what process_group's constructor throws.
  hierarchical_group(store_client& store, int rank, int world_size, std::string name, process_group_options opts = {});
  ~hierarchical_group() override;
  hierarchical_group(hierarchical_group&&) noexcept;
  hierarchical_group& operator=(hierarchical_group&&) noexcept;
  hierarchical_group(const hierarchical_group&) = delete;
  hierarchical_group& operator=(const hierarchical_group&) = delete;

  int rank() const noexcept override;
  int world_size() const noexcept override;
  const std::string& name() const noexcept override;
  /// Always cpu.
  troupe::device device() const noexcept override;

  /// Note [hierarchical allreduce]. The same argument checks as process_group::allreduce.
  work allreduce(tensor t, reduce_op op = reduce_op::sum) override;
  work broadcast(tensor t, int root) override;
  work allgather(tensor output, tensor input) override;
  work reduce_scatter(tensor output, tensor input, reduce_op op = reduce_op::sum) override;
  work barrier() override;
  void monitored_barrier(std::chrono::milliseconds timeout) override;
  /// A tensor in this host's shared arena: the local steps of an allreduce read it in place.
  tensor make_buffer(shape_t shape, troupe::dtype dt) override;
  void note_next(std::string note) override;

  /// The number of hosts, this rank's host (hosts numbered by their lowest rank), and the
  /// ranks on it in rank order.
  int hosts() const noexcept;
  int host() const noexcept;
  const std::vector<int>& host_ranks() const noexcept;
  /// The TCP group of every rank (the other collectives: reduce, gather, send, ...).
  process_group& flat();

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

/// The CPU group a job should use: a hierarchical_group when opts.transport is automatic and
/// the ranks span several hosts with more than one rank on some host, a process_group
/// otherwise. Every rank calls it with the same arguments (it publishes this rank's host
/// identity under "troupe/hg/<name>/host/<rank>" and reads every rank's). Throws what the
/// constructors throw.
std::unique_ptr<collective_group> make_cpu_group(store_client& store, int rank, int world_size, std::string name,
                                                 process_group_options opts = {});

}  // namespace troupe::ddp
