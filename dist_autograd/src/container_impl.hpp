#pragma once
// The per-worker state of distributed autograd, shared by the container (contexts, control
// messages), the recording interceptor (Note [dist autograd recording]) and the FAST engine.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
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
#include <caf/message.hpp>

#include "troupe/actors/rpc/future.hpp"
#include "troupe/actors/rpc/interceptor.hpp"
#include "troupe/dist_autograd/container.hpp"
#include "troupe/dist_autograd/functions.hpp"

namespace troupe::dist_autograd {

/// States of a PropagateGradients answer:
/// - finished here, and everything it started;
/// - a duplicate / retry that found the first attempt still running; the sender polls again
///   after a backoff;
/// - failed, with the error code and text of the worker where it failed. They are kept across
///   hops, so a worker lost two hops away is peer_lost at the root too.
inline constexpr std::int32_t propagate_done = 0;
inline constexpr std::int32_t propagate_running = 1;
inline constexpr std::int32_t propagate_failed = 2;
/// Not an answer of the receiver: the attempt's call itself failed (errc, text); sender-side only.
inline constexpr std::int32_t propagate_attempt_failed = 3;
/// The answer of PropagateGradients: (state, errc, message).
using propagate_answer = std::tuple<std::int32_t, std::int32_t, std::string>;

/// A PropagateGradients answer delivered exactly once (Note [context actor]). It is a callback
/// that answers `fallback` when dropped unanswered: its message went to an actor that ended, or
/// the actor ended with it parked. So no waiter is ever left without an answer.
template <class T>
class answer_once {
 public:
  answer_once(std::function<void(const T&)> fn, T fallback) : fn_(std::move(fn)), fallback_(std::move(fallback)) {}
  ~answer_once() {
    if (fn_) fn_(fallback_);
  }
  answer_once(const answer_once&) = delete;
  answer_once& operator=(const answer_once&) = delete;
  /// Answers with `v`; later calls do nothing.
  void operator()(const T& v) {
    auto fn = std::move(fn_);
    fn_ = nullptr;
    if (fn) fn(v);
  }

 private:
  std::function<void(const T&)> fn_;
  T fallback_;
};
template <class T>
using answer_ptr = std::shared_ptr<answer_once<T>>;

/// A thread blocked (bounded) on one answer_once: the backward's caller, a release.
template <class T>
class answer_waiter {
 public:
  /// The callback to hand to the actor; `fallback` answers it when it is dropped unanswered.
  answer_ptr<T> callback(T fallback) {
    return std::make_shared<answer_once<T>>(
        [st = st_](const T& v) {
          {
            std::lock_guard<std::mutex> lock(st->m);
            st->value = v;
            st->done = true;
          }
          st->cv.notify_all();
        },
        std::move(fallback));
  }
  /// Blocks up to `timeout`; the answer, or false when none came.
  bool wait_for(std::chrono::milliseconds timeout, T& out) const {
    std::unique_lock<std::mutex> lock(st_->m);
    if (!st_->cv.wait_for(lock, timeout, [&] { return st_->done; })) return false;
    out = st_->value;
    return true;
  }

 private:
  struct shared {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    T value{};
  };
  std::shared_ptr<shared> st_ = std::make_shared<shared>();
};

/// One PropagateGradients sent to a peer: its request number, the peer and what it carries.
struct propagation_attempt {
  std::uint64_t seq = 0;
  std::string to;
  caf::actor peer;
  message_id msg = 0;
  tensor_list grads;
};

/// What an engine run hands its PropagateGradients to: the context's actor under the run's group
/// id. The actor sends, retries and awaits them (Note [context actor]). When the run ended, the
/// run's caller tells the actor how many were started (ctx_await).
struct propagation_outbox {
  caf::actor actor;
  std::uint64_t group = 0;
  std::size_t started = 0;
  /// A first attempt sent from the run's own thread (Note [direct requests]); `slot`: its reply's.
  struct direct_attempt : propagation_attempt {
    std::size_t slot = 0;
  };
  /// Set on the root's backward only: its recv functions send first attempts through it and
  /// list them in `sent`; the caller reads their replies before it involves the actor.
  class reply_batch* direct = nullptr;
  std::vector<direct_attempt> sent;
  /// Set on a served run: its recv functions send first attempts through it (nested_run.hpp).
  class nested_run* nested = nullptr;
};

/// An incoming propagation as the record knows it (context_state::handled).
struct seen_propagation {
  bool known = false;
  propagate_answer outcome;
  bool parked = false;  ///< a duplicate waits in the actor
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
  /// Incoming propagations seen here, by (message, pass) (Note [context actor]). Each holds the
  /// outcome once known without the actor; a run that started nothing answers from the service
  /// thread. It also holds whether a duplicate went to the actor meanwhile, which then must
  /// learn the outcome.
  std::map<std::pair<message_id, std::uint64_t>, seen_propagation> handled;
  std::mutex run;   ///< serialises engine runs of this context here
  graph_pass pass;  ///< guarded by `run`
};

struct container::impl : std::enable_shared_from_this<container::impl> {
  impl(node& nd, container_options o);

  node& n;
  std::atomic<std::int64_t> backwards{0};  // backward() calls so far: the step of its fault point
  const container_options opts;
  const std::uint64_t worker_bits;
  std::atomic<std::uint64_t> next_id{0};  // contexts, messages and passes share one counter
  mutable std::mutex m;
  std::unordered_map<context_id, std::shared_ptr<context_state>> contexts;
  std::unordered_map<context_id, caf::actor> actors;  ///< the context actors (Note [context actor])
  /// Actors retrying the release of a context dropped here; an ended one is pruned at the next push.
  std::vector<caf::weak_actor_ptr> retrying;
  std::unordered_set<context_id> released;  ///< recently released ids (bounded), never recreated
  std::deque<context_id> released_order;
  std::shared_ptr<rpc::call_interceptor> recorder;  ///< set once by the container's constructor
  std::shared_ptr<struct owner_state> owned;        ///< parameters and optimizers owned here (optimizer.cpp)
  caf::actor service;  ///< this worker's service actor (Note [dist autograd service])
  std::shared_ptr<class direct_requester> requester;  ///< first attempts (Note [direct requests])
  std::mutex peers_m;
  std::map<std::string, caf::actor> peers;  ///< the peers' service actors, by worker (guarded by peers_m)

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

  /// The actor of context `id`, spawned the first time something needs it. That is a propagation
  /// or release the calling thread did not finish itself (Note [direct requests]). Null when the
  /// context is unknown here.
  caf::actor actor_of(context_id id);
  /// The service actor of `worker` (Note [dist autograd service]). For its own name it is this
  /// worker's own. Else it is looked up the first time and kept; the lookup blocks on one store
  /// round trip and a connect. Throws troupe::error naming the worker.
  caf::actor peer(const std::string& worker);
  /// The services of `workers`; a worker whose lookup fails is left out.
  std::map<std::string, caf::actor> peers_of(const std::set<std::string>& workers);
  /// Handler of PropagateGradients, deduplicated by (msg, pass). It runs the local part on this
  /// thread, the service's. `done` gets the answer, now or once what it started ended (Note
  /// [context actor]). Never throws.
  void on_propagate(context_id id, message_id msg, std::uint64_t pass, const tensor_list& grads, bool retain,
                    answer_ptr<propagate_answer> done);
  /// Handler of a release from `from`: drops the context here and forwards the release to its
  /// own peers; `done` gets the answer once they answered. Never throws.
  void serve_release(context_id id, const std::string& from, answer_ptr<std::int32_t> done);
  /// Drops the context here; returns its record (null when unknown) and, in `actor`, its actor
  /// (null when it never needed one).
  std::shared_ptr<context_state> drop(context_id id, caf::actor& actor);
  /// The workers to release context `id` on: those involved but `except` and the dead.
  std::set<std::string> release_targets(context_id id, const std::string& except) const;
  /// Releases `id` here and on the workers involved but `except`; waits for them (bounded). The
  /// context's actor sends the releases and retries those that time out.
  void release_everywhere(context_id id, const std::string& except);
  /// Releases `id` here and sends its release to the workers involved, without waiting (Note
  /// [context actor]). A release that times out is retried by a context actor; one that fails
  /// otherwise is given up. Blocks only on a first lookup of a peer's service.
  void release_async(context_id id);
  /// Blocks until every release_async of this worker was answered or given up, at most `timeout`.
  bool await_releases(std::chrono::milliseconds timeout);

  std::mutex releasing_m;
  std::condition_variable releasing_cv;
  std::size_t releasing = 0;  ///< releases of release_async in flight, per worker (guarded by releasing_m)
  /// One release of release_async to one worker ended.
  void release_ended();
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

/// Creates the owner-side state of the distributed optimizer (optimizer.cpp).
void add_optimizer_state(container::impl& c);
/// The owner side of the distributed optimizer, run by the service (optimizer.cpp). It creates
/// optimizer `id` over the parameters `keys` owned here. It applies a context's gradients with
/// it, returning the parameters updated. It forgets it. Throw troupe::error naming what was wrong.
void create_optimizer(container::impl& c, std::uint64_t id, std::int32_t kind, const std::vector<double>& h,
                      const std::vector<std::string>& keys);
std::int32_t step_optimizer(container::impl& c, std::uint64_t id, context_id ctx);
void drop_optimizer(container::impl& c, std::uint64_t id);

/// The answer of a propagation that failed with `code` and `text` (propagation.cpp).
propagate_answer propagation_failure(errc code, const std::string& text);
/// A first attempt's outcome as the context actor's on_reply reads it, from its reply (an empty
/// reply is a timeout; Note [direct requests]).
propagate_answer first_answer(const caf::message& reply, const std::string& to);

/// The bound on an actor's answer to one group of propagations: backward_timeout for the polls,
/// one more attempt's deadline, the backoffs, and a margin.
std::chrono::milliseconds propagation_bound(const container_options& opts);

}  // namespace troupe::dist_autograd
