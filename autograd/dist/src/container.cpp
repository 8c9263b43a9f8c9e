#include "troupe/dist_autograd/container.hpp"

#include <atomic>
#include <mutex>
#include <set>
#include <unordered_map>

#include "troupe/actors/rpc/api.hpp"
#include "troupe/autograd/autograd_meta.hpp"
#include "troupe/autograd/engine.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/error.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::dist_autograd {

namespace {
constexpr const char* propagate_name = "__troupe_dist_autograd_propagate";
constexpr const char* release_name = "__troupe_dist_autograd_release";
constexpr int release_attempts = 3;
}  // namespace

// ---- gradient_map ----------------------------------------------------------------------------

tensor gradient_map::at(const tensor& leaf) const {
  auto it = entries_.find(leaf.defined() ? leaf.autograd_meta() : nullptr);
  if (it == entries_.end())
    throw error(errc::bad_argument, "dist_autograd::get_gradients: no gradient for this tensor on this worker");
  return it->second.second;
}

bool gradient_map::contains(const tensor& leaf) const {
  return leaf.defined() && entries_.count(leaf.autograd_meta()) > 0;
}

void gradient_map::accumulate(const tensor& leaf, const tensor& grad) {
  if (!grad.defined()) return;
  no_grad_guard guard;
  auto [it, fresh] = entries_.try_emplace(leaf.autograd_meta(), leaf, tensor());
  it->second.second = fresh ? grad.detach().clone() : add(it->second.second, grad);
}

// ---- the per-worker state --------------------------------------------------------------------

namespace {
/// One context on one worker.
struct context_state {
  std::mutex m;
  std::unordered_map<message_id, std::shared_ptr<send_function>> sends;
  std::unordered_map<message_id, std::shared_ptr<recv_function>> recvs;
  gradient_map grads;
  std::set<std::string> workers;  ///< the workers this context exchanged tensors with
  std::vector<std::pair<std::string, rpc::future<std::int32_t>>> outstanding;  ///< (to, propagation) not waited for
  std::set<std::string> lost;  ///< workers a propagation found dead (no release is sent to them)
  bool retain = false;  ///< retain_graph of the latest pass here (forwarded with propagations)
};
}  // namespace

struct container::impl : std::enable_shared_from_this<container::impl> {
  node& n;
  std::uint64_t worker_bits;
  std::atomic<std::uint64_t> next_context{0};
  std::atomic<std::uint64_t> next_message{0};
  mutable std::mutex m;
  std::unordered_map<context_id, std::shared_ptr<context_state>> contexts;

  explicit impl(node& nd)
      : n(nd), worker_bits(static_cast<std::uint64_t>(nd.info().rank) << 48) {}

  std::shared_ptr<context_state> find(context_id id, const char* op) const {
    std::lock_guard<std::mutex> lock(m);
    auto it = contexts.find(id);
    if (it == contexts.end())
      throw error(errc::bad_argument, std::string("dist_autograd::") + op + ": unknown context " + std::to_string(id) +
                                          " on " + n.info().name);
    return it->second;
  }

  std::shared_ptr<context_state> find_or_create(context_id id) {
    std::lock_guard<std::mutex> lock(m);
    auto& slot = contexts[id];
    if (!slot) slot = std::make_shared<context_state>();
    return slot;
  }

  /// Runs the engine from `roots`, capturing leaf gradients into `ctx`.
  static void run_pass(context_state& ctx, std::vector<std::pair<edge, tensor>> roots, bool retain) {
    graph_task task;
    task.roots = std::move(roots);
    task.retain_graph = retain;
    task.capture_leaves = true;
    task.capture = [&ctx](const edge& e, const tensor& g) {
      auto* acc = dynamic_cast<accumulate_grad*>(e.fn.get());
      if (!acc) return;
      std::lock_guard<std::mutex> lock(ctx.m);
      ctx.grads.accumulate(acc->variable(), g);
    };
    engine().execute(task);
  }

  /// Waits for every propagation recorded in `ctx` (also those added meanwhile); rethrows the
  /// first error after all completed or failed.
  void drain(context_state& ctx) const {
    std::exception_ptr first;
    for (;;) {
      std::vector<std::pair<std::string, rpc::future<std::int32_t>>> batch;
      {
        std::lock_guard<std::mutex> lock(ctx.m);
        batch.swap(ctx.outstanding);
      }
      if (batch.empty()) break;
      for (auto& [to, f] : batch) {
        try {
          f.get();  // bounded by the call's deadline
        } catch (const error& e) {
          if (e.code() == errc::peer_lost) {
            std::lock_guard<std::mutex> lock(ctx.m);
            ctx.lost.insert(to);
          }
          if (!first) first = std::current_exception();
        } catch (...) {
          if (!first) first = std::current_exception();
        }
      }
    }
    if (first) std::rethrow_exception(first);
  }

  /// The propagate callback of a recv_function recorded under (ctx, msg) from `from`.
  recv_function::propagate_fn propagator(context_id id, message_id msg, std::string from) {
    std::weak_ptr<impl> weak = weak_from_this();
    return [weak, id, msg, from = std::move(from)](const tensor_list& grads) {
      auto self = weak.lock();
      if (!self) throw error(errc::invalid_state, "dist_autograd: the container was destroyed during backward");
      auto ctx = self->find(id, "backward");
      bool retain = false;
      {
        std::lock_guard<std::mutex> lock(ctx->m);
        retain = ctx->retain;
      }
      auto f = rpc_async<std::int32_t>(self->n, from, propagate_name, id, msg, grads, retain);
      std::lock_guard<std::mutex> lock(ctx->m);
      ctx->outstanding.emplace_back(from, std::move(f));
    };
  }

  /// The handler of PropagateGradients: runs the send function `msg` of context `id`.
  std::int32_t on_propagate(context_id id, message_id msg, const tensor_list& grads, bool retain) {
    auto ctx = find(id, "propagate");
    std::shared_ptr<send_function> send;
    {
      std::lock_guard<std::mutex> lock(ctx->m);
      auto it = ctx->sends.find(msg);
      if (it != ctx->sends.end()) send = it->second;
    }
    if (!send)
      throw error(errc::bad_argument, "dist_autograd::propagate: no send function for message " +
                                          std::to_string(msg) + " in context " + std::to_string(id));
    if (grads.size() != send->next_edges().size())
      throw error(errc::bad_argument, "dist_autograd::propagate: " + std::to_string(grads.size()) +
                                          " gradients for a send of " + std::to_string(send->next_edges().size()));
    {
      std::lock_guard<std::mutex> lock(ctx->m);
      ctx->retain = retain;
    }
    std::vector<std::pair<edge, tensor>> roots;
    for (std::size_t i = 0; i < grads.size(); ++i)
      roots.emplace_back(edge{send, static_cast<std::uint32_t>(i)}, grads[i]);
    std::exception_ptr err;
    try {
      run_pass(*ctx, std::move(roots), retain);
    } catch (...) {
      err = std::current_exception();
    }
    finish(*ctx, err);
    return 0;
  }

  /// Waits for what a pass started, even after an error, then rethrows the first error.
  void finish(context_state& ctx, std::exception_ptr err) const {
    try {
      drain(ctx);
    } catch (...) {
      if (!err) err = std::current_exception();
    }
    if (err) std::rethrow_exception(err);
  }

  /// Removes the context here; returns the workers to forward the release to (not those lost).
  std::set<std::string> drop(context_id id) {
    std::shared_ptr<context_state> ctx;
    {
      std::lock_guard<std::mutex> lock(m);
      auto it = contexts.find(id);
      if (it == contexts.end()) return {};
      ctx = std::move(it->second);
      contexts.erase(it);
    }
    std::lock_guard<std::mutex> lock(ctx->m);
    std::set<std::string> out;
    for (const auto& w : ctx->workers)
      if (!ctx->lost.count(w)) out.insert(w);
    return out;
  }

  void release_everywhere(context_id id) {
    for (const auto& w : drop(id)) {
      for (int attempt = 0; attempt < release_attempts; ++attempt) {
        try {
          rpc_sync<std::int32_t>(n, w, release_name, id);
          break;
        } catch (const error& e) {
          if (e.code() != errc::timeout) break;  // peer gone or refused: nothing left to release
        }
      }
    }
  }
};

// ---- container ------------------------------------------------------------------------------

container::container(node& n) : impl_(std::make_shared<impl>(n)) {
  std::weak_ptr<impl> weak = impl_;
  n.functions().add(propagate_name, [weak](std::uint64_t id, std::uint64_t msg, tensor_list grads, bool retain) {
    auto self = weak.lock();
    if (!self) throw error(errc::invalid_state, "dist_autograd: no container on this worker");
    return self->on_propagate(id, msg, grads, retain);
  });
  n.functions().add(release_name, [weak](std::uint64_t id) {
    if (auto self = weak.lock()) self->release_everywhere(id);
    return std::int32_t{0};
  });
}

container::~container() = default;

context_id container::create_context() {
  const context_id id = impl_->worker_bits | (impl_->next_context.fetch_add(1) + 1);
  impl_->find_or_create(id);
  return id;
}

void container::release(context_id id) { impl_->release_everywhere(id); }

std::size_t container::num_contexts() const {
  std::lock_guard<std::mutex> lock(impl_->m);
  return impl_->contexts.size();
}

message_id container::record_send(context_id ctx_id, const tensor_list& tensors, const std::string& to) {
  auto ctx = impl_->find(ctx_id, "record_send");
  edge_list edges;
  for (const auto& t : tensors) edges.push_back(t.defined() ? gradient_edge(t) : edge{});
  const message_id msg = impl_->worker_bits | (impl_->next_message.fetch_add(1) + 1);
  std::lock_guard<std::mutex> lock(ctx->m);
  ctx->sends.emplace(msg, std::make_shared<send_function>(std::move(edges)));
  ctx->workers.insert(to);
  return msg;
}

tensor_list container::record_recv(context_id ctx_id, message_id msg, const std::string& from,
                                   const tensor_list& tensors) {
  auto ctx = impl_->find_or_create(ctx_id);
  auto recv = std::make_shared<recv_function>(static_cast<std::uint32_t>(tensors.size()), from,
                                              impl_->propagator(ctx_id, msg, from));
  tensor_list out;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const tensor& t = tensors[i];
    if (!t.defined() || !is_floating(t.dtype())) {
      out.push_back(t);
      continue;
    }
    tensor r = t.detach();
    auto& meta = materialize_meta(r);
    meta.grad_fn = recv;
    meta.output_nr = static_cast<std::uint32_t>(i);
    out.push_back(std::move(r));
  }
  std::lock_guard<std::mutex> lock(ctx->m);
  ctx->recvs.emplace(msg, std::move(recv));
  ctx->workers.insert(from);
  return out;
}

void container::backward(context_id ctx_id, const tensor_list& roots, bool retain_graph) {
  auto ctx = impl_->find(ctx_id, "backward");
  std::vector<std::pair<edge, tensor>> task_roots;
  for (std::size_t i = 0; i < roots.size(); ++i) {
    const tensor& r = roots[i];
    if (!r.defined() || !r.requires_grad())
      throw error(errc::autograd_error, "dist_autograd::backward: root " + std::to_string(i) + " does not require grad");
    if (r.numel() != 1)
      throw error(errc::autograd_error, "dist_autograd::backward: root " + std::to_string(i) + " has " +
                                            std::to_string(r.numel()) + " elements, expected one");
    task_roots.emplace_back(gradient_edge(r), ones_like(r));
  }
  {
    std::lock_guard<std::mutex> lock(ctx->m);
    ctx->retain = retain_graph;
  }
  std::exception_ptr err;
  try {
    impl::run_pass(*ctx, std::move(task_roots), retain_graph);
  } catch (...) {
    err = std::current_exception();
  }
  impl_->finish(*ctx, err);
}

gradient_map container::get_gradients(context_id ctx_id) const {
  auto ctx = impl_->find(ctx_id, "get_gradients");
  std::lock_guard<std::mutex> lock(ctx->m);
  return ctx->grads;
}

// ---- context --------------------------------------------------------------------------------

context::context(container& c) : c_(c), id_(c.create_context()) {}

context::~context() {
  try {
    c_.release(id_);
  } catch (...) {  // a destructor never throws; release is best effort by design
  }
}

}  // namespace troupe::dist_autograd
