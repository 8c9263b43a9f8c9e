#pragma once
// The per-worker state of distributed autograd, shared by the container (contexts, control
// messages), the recording interceptor (Note [dist autograd recording]) and the FAST engine.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <caf/actor.hpp>

#include "troupe/actors/rpc/future.hpp"
#include "troupe/actors/rpc/interceptor.hpp"
#include "troupe/dist_autograd/container.hpp"
#include "troupe/dist_autograd/functions.hpp"

namespace troupe::dist_autograd {

inline constexpr const char* propagate_name = "__troupe_dist_autograd_propagate";
inline constexpr const char* release_name = "__troupe_dist_autograd_release";
/// States of a PropagateGradients answer: finished here (and everything it started), a duplicate /
/// retry that found the first attempt still running (the sender polls again after a backoff), or
/// failed with the error code and text of the worker where it failed (kept across hops, so a
/// worker lost two hops away is peer_lost at the root too).
inline constexpr std::int32_t propagate_done = 0;
inline constexpr std::int32_t propagate_running = 1;
inline constexpr std::int32_t propagate_failed = 2;
/// The answer of PropagateGradients: (state, errc, message).
using propagate_answer = std::tuple<std::int32_t, std::int32_t, std::string>;

/// One PropagateGradients in flight; awaited (and retried) by the run that started it.
struct propagation {
  std::string to;
  context_id ctx = 0;
  message_id msg = 0;
  std::uint64_t pass = 0;
  bool retain = false;
  tensor_list grads;
  int attempt = 0;
  rpc::future<propagate_answer> result;
};

/// The outcome of one propagation handled here, shared with its duplicates (dedupe).
struct handled_propagation {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};

/// Dependencies and input buffers of one backward pass of one context on this worker
/// (Note [FAST mode backward]); guarded by context_state::run.
struct graph_pass {
  std::uint64_t id = 0;  ///< the pass whose dependencies are computed (0: none yet)
  bool retain = false;
  std::unordered_map<grad_node*, int> deps;
  std::unordered_map<grad_node*, tensor_list> buffers;
};

/// One context on one worker.
struct context_state {
  explicit context_state(context_id i) : id(i) {}
  const context_id id;
  std::mutex m;  // guards everything below but `run` and `pass`
  std::unordered_map<message_id, std::shared_ptr<send_function>> sends;
  std::unordered_map<message_id, std::shared_ptr<recv_function>> recvs;
  gradient_map grads;
  std::set<std::string> workers;  ///< workers this context exchanged messages with
  std::set<std::string> lost;     ///< workers found dead (no release is sent to them)
  std::map<std::pair<message_id, std::uint64_t>, std::shared_ptr<handled_propagation>> handled;
  std::mutex run;   ///< serialises engine runs of this context here
  graph_pass pass;  ///< guarded by `run`
};

struct container::impl : std::enable_shared_from_this<container::impl> {
  impl(node& nd, container_options o);

  node& n;
  const container_options opts;
  const std::uint64_t worker_bits;
  std::atomic<std::uint64_t> next_id{0};  // contexts, messages and passes share one counter
  mutable std::mutex m;
  std::unordered_map<context_id, std::shared_ptr<context_state>> contexts;
  std::unordered_map<context_id, caf::actor> actors;  ///< the context actors (Note [context actor])
  std::unordered_set<context_id> released;  ///< recently released ids (bounded), never recreated
  std::deque<context_id> released_order;
  std::shared_ptr<rpc::call_interceptor> recorder;  ///< set once by the container's constructor
  std::shared_ptr<struct owner_state> owned;        ///< parameters and optimizers owned here (optimizer.cpp)

  /// A new globally unique id (worker rank << 48 | counter).
  std::uint64_t new_id() { return worker_bits | (next_id.fetch_add(1) + 1); }
  /// The context or bad_argument naming `op`.
  std::shared_ptr<context_state> find(context_id id, const char* op) const;
  /// The context, or null when it does not exist here.
  std::shared_ptr<context_state> find_if(context_id id) const;
  /// The context, created when first seen (null when it was released here already).
  std::shared_ptr<context_state> find_or_create(context_id id);

  /// Sender side: records a send_function for `tensors` (invalid edges for those without grad).
  message_id record_send(context_state& ctx, const tensor_list& tensors, const std::string& to);
  /// Receiver side: a recv_function for `num` tensors from `from` under (ctx, msg).
  std::shared_ptr<recv_function> record_recv(context_state& ctx, message_id msg, const std::string& from,
                                             std::uint32_t num);

  /// Waits for `started` (retrying timed-out attempts); rethrows the first error after all ended.
  void drain(context_state& ctx, std::vector<propagation>& started);
  /// Handler of PropagateGradients (deduplicated by (msg, pass)); never throws.
  propagate_answer on_propagate(context_id id, message_id msg, std::uint64_t pass, std::int32_t attempt, const tensor_list& grads,
                    bool retain);
  void run_propagation(context_state& ctx, message_id msg, std::uint64_t pass, const tensor_list& grads, bool retain);
  /// Drops the context here; returns its actor (null when unknown), which runs the release.
  caf::actor drop(context_id id);
  /// Releases `id` here and on the workers involved but `except`; waits for them (bounded).
  void release_everywhere(context_id id, const std::string& except);
};

/// The context current on this thread and the container it belongs to.
struct current_context_slot {
  const container::impl* owner = nullptr;
  context_id id = 0;
};
/// This thread's slot (context RAII and served calls set it).
current_context_slot& current_slot();

/// The interceptor that records send/recv functions for `c` (Note [dist autograd recording]).
std::shared_ptr<rpc::call_interceptor> make_recorder(std::weak_ptr<container::impl> c);

/// The container's state, for the library's other parts.
struct container_access {
  static const std::shared_ptr<container::impl>& of(const container& c) { return c.impl_; }
};

/// Creates the owner-side state and registers the optimizer's reserved functions on `c.n`.
void add_optimizer_functions(const std::shared_ptr<container::impl>& c);

/// Starts `p` (a new attempt) through `n`.
void start_propagation(node& n, const container_options& opts, propagation& p);

}  // namespace troupe::dist_autograd
