#pragma once
// The DDP reducer: buckets, their actors, readiness, launch order and the final wait.
//
// Note [DDP reducer]
// ------------------
// Buckets: parameters are packed into buckets of one dtype. The first iteration takes them in
// reverse order of parameters(). Later ones take the order their gradients became ready on
// rank 0, broadcast to every rank. A bucket is closed once it holds >= its cap:
// first_bucket_cap_mb for the first bucket, bucket_cap_mb for later ones. Every bucket owns a
// flat buffer.
//
// There is one typed bucket actor per bucket (Note [bucket actor]). It runs on the node's actor
// system when ddp_options::node names one. Else it runs on a one-thread actor system the reducer
// owns; the group alone does not reach a node. States of a bucket actor:
//
//   waiting(pending = n, turn = index == 0)
//      --ready(param)--> pending - 1        --turn--> turn = true
//   pending == 0 && turn:  comm hook -> collective_group work (async, issue order) -> launch_board
//                          send turn to bucket index + 1; back to waiting(n, index == 0)
//
// So the reductions are launched in bucket-index order on every rank, whatever order the
// gradients become ready in, and the group's worker runs them in that order.
//
//   backward thread                       bucket actors                   pg worker
//   hook(p): copy grad -> bucket slice
//            ready(p) ------------------> pending--, maybe launch ------> allreduce b
//   last hook: wait until all launched <- board.fill(b, work)
//              wait works, then-steps, write averaged grads to .grad
//
// find_unused_parameters (PyTorch's semantics): prepare() marks the parameters the forward's
// outputs do not reach ready at once. Their bucket slice gets their current .grad, zeros when
// undefined. So a rank that did not use a parameter contributes zero, or what no_sync
// accumulated. Each rank keeps a locally-used map: a gradient arrived since the last
// synchronised backward, no_sync passes included. After every bucket launched, finalize()
// allreduces it (max). It always runs after the buckets, so the order is the same on every
// rank. A parameter used on some rank gets the average. One unused on every rank keeps its
// .grad untouched (undefined stays undefined).
//
// The last post-accumulate-grad hook of the pass runs once every parameter is ready or marked
// unused. It blocks the backward thread until every bucket launched and every work completed.
// So backward returns with averaged gradients. It waits bucket by bucket in index order. It
// copies each bucket's averages to .grad as soon as that bucket is done, so the copy overlaps
// the next bucket's reduction. With find_unused_parameters all copies wait for the used map.
// Failures (peer_lost, timeout) surface there, as the error of backward; the .grad of later
// buckets then keep their local values. A backward that left parameters unready is detected at
// the next forward (autograd_error naming them). The launched works are drained and the actors
// reset first.
// Assumes: every rank runs the same number of forward/backward pairs with the same buckets.

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bucket_actor.hpp"
#include "troupe/ddp/distributed_data_parallel.hpp"

namespace troupe::ddp::detail {

struct bucket {
  troupe::dtype dtype = troupe::dtype::float32;
  tensor buffer;
  std::vector<std::size_t> params;     // indices into parameters()
  std::vector<std::int64_t> offsets;   // element offset of each in buffer
  std::vector<tensor> views;           // buffer slices shaped like each parameter
};

/// Packs `order` (parameter indices) into buckets (Note [DDP reducer]).
std::vector<std::vector<std::size_t>> assign_buckets(const tensor_list& params, const std::vector<std::size_t>& order,
                                                     double first_cap_mb, double cap_mb);

class reducer {
 public:
  /// Runs the bucket actors on `system` (the node's, which must outlive the reducer), or on an
  /// actor system of its own when null.
  reducer(tensor_list params, std::vector<std::string> names, collective_group& group, const ddp_options& opts,
          caf::actor_system* system);
  /// Drains the launched works and stops the bucket actors (Note [bucket actor]). Never throws.
  ~reducer();
  reducer(const reducer&) = delete;
  reducer& operator=(const reducer&) = delete;

  /// Stops the bucket actors for good, bounded by opts.timeout (the node's shutdown runs it:
  /// Note [shutdown hooks]); build, prepare and on_grad_ready then throw invalid_state. Never throws.
  void detach() noexcept;
  /// Throws invalid_state naming `what` after detach().
  void check_attached(const char* what) const;

  /// Rebuilds buckets and actors for `assignment`.
  void build(const std::vector<std::vector<std::size_t>>& assignment);
  /// Arms the next backward (sync: reduce; else let grads accumulate locally).
  void prepare(bool sync, const tensor_list& outputs);
  /// Post-accumulate-grad hook of parameter `i` (backward thread).
  void on_grad_ready(std::size_t i);
  /// Throws autograd_error when the previous backward left parameters unready (after draining).
  void check_previous_finished();

  bool needs_rebuild() const { return !rebuilt_ && iterations_ > 0; }
  /// Synchronised backward passes finished so far.
  int iterations() const { return iterations_; }
  /// The step the backward and allreduce fault points report until the next call (the DDP's
  /// forward count; set before prepare, passed to the bucket actors in their ready messages).
  void set_step(std::int64_t s) { step_.store(s, std::memory_order_relaxed); }
  void mark_rebuilt() { rebuilt_ = true; }
  const std::vector<std::size_t>& ready_order() const { return ready_order_; }
  std::vector<std::vector<std::size_t>> assignment() const;
  std::vector<int> launch_order() const;
  reduction_timeline timeline() const;
  /// Between backward passes only (the actors read it when they launch).
  void set_hook(comm_hook h) { shared_->hook = std::move(h); }

 private:
  void mark_ready(std::size_t i);
  void finalize();
  work launch_used_map();
  /// Averaged values of `bk` to the .grad of its parameters (skipping those unused everywhere).
  void write_back(bucket& bk, const std::vector<std::uint8_t>& globally_used);
  void record_timeline(const std::vector<std::optional<comm_result>>& results,
                       std::chrono::steady_clock::time_point last_grad);
  void drain() noexcept;
  /// Sends exit to every bucket actor and waits for their down messages (opts_.timeout).
  void stop_actors() noexcept;
  std::vector<bool> reachable(const tensor_list& outputs) const;

  tensor_list params_;
  std::vector<std::string> names_;
  collective_group& group_;
  ddp_options opts_;
  std::vector<bucket> buckets_;
  std::vector<std::pair<std::size_t, std::size_t>> slot_of_;  // param -> (bucket, position)
  std::vector<bool> ready_;
  std::vector<std::uint8_t> locally_used_;  // got a gradient since the last synchronised backward
  tensor used_map_;                          // the allreduced map of the last backward
  std::size_t ready_count_ = 0;
  bool armed_ = false;
  bool rebuilt_ = false;
  int iterations_ = 0;
  std::atomic<std::int64_t> step_{0};
  std::atomic<bool> detached_{false};  // detach() ran: the actor system is going away
  std::vector<std::size_t> ready_order_;

  std::chrono::steady_clock::time_point armed_at_;  // timeline origin
  mutable std::mutex mu_;                            // guards timeline_
  reduction_timeline timeline_;

  std::unique_ptr<caf::actor_system_config> own_cfg_;  // without a node: the reducer's own system
  std::unique_ptr<caf::actor_system> own_system_;
  caf::actor_system* system_;
  std::shared_ptr<bucket_shared> shared_;  // Note [bucket actor]
  std::vector<bucket_actor> actors_;
};

}  // namespace troupe::ddp::detail
