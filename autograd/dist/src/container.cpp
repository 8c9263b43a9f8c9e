// Contexts, PropagateGradients and release (Notes [dist autograd recording] in container.hpp and
// [FAST mode backward] in fast_engine.hpp).
#include "troupe/dist_autograd/container.hpp"

#include <algorithm>
#include <thread>

#include "container_impl.hpp"
#include "fast_engine.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/autograd/autograd_meta.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/error.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::dist_autograd {

namespace {
constexpr std::size_t max_remembered_releases = 65536;
thread_local current_context_slot tls_current;

}  // namespace

current_context_slot& current_slot() { return tls_current; }

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

// ---- contexts --------------------------------------------------------------------------------

container::impl::impl(node& nd, container_options o)
    : n(nd), opts(o), worker_bits(static_cast<std::uint64_t>(nd.info().rank) << 48) {}

std::shared_ptr<context_state> container::impl::find_if(context_id id) const {
  std::lock_guard<std::mutex> lock(m);
  auto it = contexts.find(id);
  return it == contexts.end() ? nullptr : it->second;
}

std::shared_ptr<context_state> container::impl::find(context_id id, const char* op) const {
  auto ctx = find_if(id);
  if (!ctx)
    throw error(errc::bad_argument, std::string("dist_autograd::") + op + ": unknown context " + std::to_string(id) +
                                        " on " + n.info().name);
  return ctx;
}

std::shared_ptr<context_state> container::impl::find_or_create(context_id id) {
  std::lock_guard<std::mutex> lock(m);
  if (released.count(id)) return nullptr;
  auto& slot = contexts[id];
  if (!slot) slot = std::make_shared<context_state>(id);
  return slot;
}

message_id container::impl::record_send(context_state& ctx, const tensor_list& tensors, const std::string& to) {
  edge_list edges;
  for (const auto& t : tensors) edges.push_back(t.defined() && t.requires_grad() ? gradient_edge(t) : edge{});
  const message_id msg = new_id();
  auto send = std::make_shared<send_function>(std::move(edges));
  std::lock_guard<std::mutex> lock(ctx.m);
  ctx.sends.emplace(msg, std::move(send));
  ctx.workers.insert(to);
  return msg;
}

std::shared_ptr<recv_function> container::impl::record_recv(context_state& ctx, message_id msg,
                                                             const std::string& from, std::uint32_t num) {
  std::weak_ptr<impl> weak = weak_from_this();
  auto propagate = [weak, id = ctx.id, msg, from](const tensor_list& grads) {
    run_info* run = current_run();
    auto self = weak.lock();
    if (!run || !self) throw error(errc::invalid_state, "dist_autograd: a recv function ran outside a distributed backward");
    propagation p{from, id, msg, run->pass, run->retain, grads, 0, {}};
    start_propagation(self->n, self->opts, p);
    run->started->push_back(std::move(p));
  };
  auto recv = std::make_shared<recv_function>(num, from, std::move(propagate));
  std::lock_guard<std::mutex> lock(ctx.m);
  ctx.recvs.emplace(msg, recv);
  ctx.workers.insert(from);
  return recv;
}

// ---- release ---------------------------------------------------------------------------------

std::set<std::string> container::impl::drop(context_id id) {
  std::shared_ptr<context_state> ctx;
  {
    std::lock_guard<std::mutex> lock(m);
    if (released.insert(id).second) {
      released_order.push_back(id);
      if (released_order.size() > max_remembered_releases) {
        released.erase(released_order.front());
        released_order.pop_front();
      }
    }
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

namespace {
/// Sends release(id) to `workers` in parallel, retrying timed-out attempts with backoff.
void send_releases(node& n, const container_options& opts, context_id id, const std::set<std::string>& workers) {
  struct attempt {
    std::string to;
    rpc::future<std::int32_t> f;
  };
  std::vector<attempt> pending;
  auto start = [&](const std::string& to) {
    return rpc_async<std::int32_t>(n, to, release_name, rpc::deadline{opts.release_timeout}, id, n.info().name);
  };
  for (const auto& w : workers) pending.push_back({w, start(w)});
  for (int round = 1; !pending.empty(); ++round) {
    std::vector<attempt> retry;
    for (auto& a : pending) {
      try {
        a.f.get();
      } catch (const error& e) {
        if (e.code() == errc::timeout && round < opts.attempts) retry.push_back(std::move(a));
        // Otherwise the peer is gone or refused: nothing is left to release there.
      }
    }
    if (!retry.empty()) std::this_thread::sleep_for(opts.backoff * (1 << (round - 1)));
    for (auto& a : retry) a.f = start(a.to);
    pending = std::move(retry);
  }
}
}  // namespace

void container::impl::release_everywhere(context_id id, const std::string& except) {
  auto workers = drop(id);
  workers.erase(except);
  send_releases(n, opts, id, workers);
}

// ---- container ------------------------------------------------------------------------------

container::container(node& n, container_options opts) : impl_(std::make_shared<impl>(n, opts)) {
  std::weak_ptr<impl> weak = impl_;
  n.functions().add(propagate_name, [weak](std::uint64_t id, std::uint64_t msg, std::uint64_t pass,
                                           std::int32_t attempt, tensor_list grads, bool retain) {
    auto self = weak.lock();
    if (!self)
      return propagate_answer{propagate_failed, static_cast<std::int32_t>(errc::invalid_state), "no container on this worker"};
    return self->on_propagate(id, msg, pass, attempt, grads, retain);
  });
  n.functions().add(release_name, [weak](std::uint64_t id, std::string from) {
    if (auto self = weak.lock()) self->release_everywhere(id, from);
    return std::int32_t{0};
  });
  add_optimizer_functions(impl_);
  impl_->recorder = make_recorder(impl_);
  n.set_interceptor(impl_->recorder);
}

std::shared_ptr<rpc::call_interceptor> container::interceptor() const { return impl_->recorder; }

container::~container() { impl_->n.set_interceptor(nullptr); }

node& container::this_node() noexcept { return impl_->n; }

context_id container::create_context() {
  const context_id id = impl_->new_id();
  impl_->find_or_create(id);
  return id;
}

void container::release(context_id id) { impl_->release_everywhere(id, std::string()); }

std::size_t container::num_contexts() const {
  std::lock_guard<std::mutex> lock(impl_->m);
  return impl_->contexts.size();
}

context_id container::current_context() const {
  return tls_current.owner == impl_.get() ? tls_current.id : 0;
}

void container::backward(context_id ctx_id, const tensor_list& roots, bool retain_graph) {
  auto ctx = impl_->find(ctx_id, "backward");
  edge_list edges;
  tensor_list grads;
  for (std::size_t i = 0; i < roots.size(); ++i) {
    const tensor& r = roots[i];
    if (!r.defined() || !r.requires_grad())
      throw error(errc::autograd_error, "dist_autograd::backward: root " + std::to_string(i) + " does not require grad");
    if (r.numel() != 1)
      throw error(errc::autograd_error, "dist_autograd::backward: root " + std::to_string(i) + " has " +
                                            std::to_string(r.numel()) + " elements, expected one");
    edges.push_back(gradient_edge(r));
    grads.push_back(ones_like(r));
  }
  auto root = std::make_shared<graph_root>(std::move(edges), std::move(grads));
  std::vector<propagation> started;
  std::exception_ptr err;
  try {
    execute_fast(*ctx, impl_->new_id(), retain_graph, root, {}, started);
  } catch (...) {
    err = std::current_exception();
  }
  try {
    impl_->drain(*ctx, started);
  } catch (...) {
    if (!err) err = std::current_exception();
  }
  if (!err) return;
  std::set<std::string> others;  // a failed backward releases the context on the other workers
  {
    std::lock_guard<std::mutex> lock(ctx->m);
    for (const auto& w : ctx->workers)
      if (!ctx->lost.count(w)) others.insert(w);
  }
  send_releases(impl_->n, impl_->opts, ctx_id, others);
  std::rethrow_exception(err);
}

gradient_map container::get_gradients(context_id ctx_id) const {
  auto ctx = impl_->find(ctx_id, "get_gradients");
  std::lock_guard<std::mutex> lock(ctx->m);
  return ctx->grads;
}

// ---- context --------------------------------------------------------------------------------

context::context(container& c)
    : c_(c), id_(c.create_context()), previous_owner_(tls_current.owner), previous_(tls_current.id) {
  tls_current = {c.impl_.get(), id_};
}

context::~context() {
  tls_current = {static_cast<const container::impl*>(previous_owner_), previous_};
  try {
    c_.release(id_);
  } catch (...) {  // a destructor never throws; release is best effort by design
  }
}

}  // namespace troupe::dist_autograd
