#pragma once
/// \file live_group.hpp
/// Live recovery of a data-parallel job. When a rank dies, the survivors keep their state. The
/// launcher starts a replacement for the dead rank only (`troupe-run --restart rank`). The
/// replacement receives the current training state from a live peer. No checkpoint is read.
///
/// Note [live recovery]
/// --------------------
/// A live_group holds the job's current process group, one generation at a time. Generation g
/// is the group named "<name>-g<g>"; the store keys live under "troupe/live/<name>/".
///
///   first start:  every rank: member g0/<rank>, form group g0, set gen = 0
///   a rank dies:  survivors' collective fails with peer_lost (the group stays broken)
///   survivors:    recover(): set g<g+1>/open and gen = g+1, member, form group g<g+1>, sync
///   replacement:  start(): G = gen; while g<G>/member/<rank> is set (its predecessor's),
///                 wait for g<G+1>/open, G += 1; then member, form group g<G>, sync
///
///   sync:  every rank rolls its counters and generators back to its last commit();
///          allgather of committed steps; the lowest rank with the highest step is the source;
///          broadcast of its state size, then of its state bytes; the others load them
///
/// The state is what was tracked: modules, optimizers, generators and counters, under their
/// names, as in the checkpointer. It must be replicated: equal on every rank at a commit, as
/// DDP keeps parameters and optimizer state. Per-rank data (a shard) is derived from the rank.
/// The contract of a step: commit(step) follows the optimizer step, and modules and optimizers
/// change only after the step's last collective. So a step that failed on a survivor left its
/// modules and optimizers at the last commit; counters and generators are rolled back. The step
/// is then replayed from the same state. With two ranks (what the tests check) the result is
/// bitwise that of an undisturbed run. With more, DDP is wrapped anew after a recovery, and
/// its buckets may then sum some elements in another order than the undisturbed run did.
///
/// Limits: rank 0 hosts the store, so its death cannot be recovered live (the launcher
/// restarts the whole job). A death while a generation forms makes that start() or recover()
/// fail (timeout or peer_lost); recover() may be called again for the next generation. Each
/// wait is bounded: the store and the sync by options.timeout, a rendezvous by group.timeout.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "troupe/autograd/nn/module.hpp"
#include "troupe/autograd/optim/optimizer.hpp"
#include "troupe/ddp/process_group.hpp"
#include "troupe/tensors/generator.hpp"

namespace troupe {
class store_client;
}

namespace troupe::ddp {

/// Options of a live_group.
struct live_group_options {
  /// Options of every generation's process group (group.timeout bounds its rendezvous).
  process_group_options group;
  /// Bound of each wait on the store and of each collective of a sync.
  std::chrono::milliseconds timeout{60000};
};

/// The process group of a job that survives the death of a rank (Note [live recovery]).
/// Every rank makes one with the same name and tracks the same names in the same order. Not
/// thread-safe; use it from the training thread. `store` must outlive it.
class live_group {
 public:
  /// Forms no group yet (start() does). `replacement`: this process replaces a dead rank
  /// (troupe-run sets TROUPE_REPLACEMENT=1). Throws bad_argument for a rank outside
  /// [0, world_size) or an empty name.
  live_group(store_client& store, int rank, int world_size, std::string name, bool replacement,
             live_group_options opts = {});
  ~live_group();
  live_group(const live_group&) = delete;
  live_group& operator=(const live_group&) = delete;

  /// Tracks a module's state_dict under `name`.
  void track(const std::string& name, nn::module& m);
  /// Tracks an optimizer's state_dict under `name`.
  void track(const std::string& name, optim::optimizer& opt);
  /// Tracks a generator's seed and offset under `name`.
  void track(const std::string& name, generator& gen);
  /// Tracks an integer (a data position, an epoch) under `name`.
  void track(const std::string& name, std::int64_t& value);

  /// Joins the job and returns the step training continues after: 0 on a first start; for a
  /// replacement, the step of the state it received from a live peer. Blocks up to the
  /// timeout per wait. Errors: timeout, peer_lost, the group's errors, checkpoint_corrupt or
  /// load_state_dict's when the received state does not fit.
  std::int64_t start();
  /// Records that `step` completed on this rank (after the optimizer step): the state to
  /// resume from. Never blocks.
  void commit(std::int64_t step);
  /// After a collective failed with peer_lost: forms the next generation with the
  /// replacement, brings every rank to the newest committed state and returns its step.
  /// Blocks until the replacement joined (up to the timeout). Errors as start().
  std::int64_t recover();

  /// The current generation's group. Throws invalid_state before start().
  process_group& group();
  /// The current generation (0 at the first start).
  std::int64_t generation() const noexcept { return generation_; }
  /// The last committed step (-1 on a replacement before start()).
  std::int64_t committed() const noexcept { return committed_; }
  /// The rank whose state the last sync loaded (-1 before any).
  int last_source() const noexcept { return last_source_; }
  /// The bytes of the state of the last sync (0 before any).
  std::uint64_t last_state_bytes() const noexcept { return last_bytes_; }
  /// True for the errors recover() heals: peer_lost (a rank of the group died).
  static bool recoverable(const error& e) noexcept;

 private:
  struct tracked;
  std::string key(const std::string& tail) const;
  std::string gen_key(std::int64_t g, const std::string& tail) const;
  void form(std::int64_t g);
  std::int64_t find_generation();
  std::int64_t sync();

  store_client& store_;
  int rank_;
  int world_size_;
  std::string name_;
  bool replacement_;
  live_group_options opts_;
  std::unique_ptr<tracked> state_;
  std::unique_ptr<process_group> group_;
  std::int64_t generation_ = 0;
  std::int64_t committed_ = -1;
  int last_source_ = -1;
  std::uint64_t last_bytes_ = 0;
};

}  // namespace troupe::ddp
