// Contexts, PropagateGradients and release (Notes [dist autograd recording] in container.hpp and
// [FAST mode backward] in fast_engine.hpp).
#include "troupe/dist_autograd/container.hpp"

#include <algorithm>
#include <thread>

#include <caf/all.hpp>

#include "container_impl.hpp"
#include "context_actor.hpp"
#include "fast_engine.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/rpc/registry.hpp"
#include "troupe/autograd/autograd_meta.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/error.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::dist_autograd {

namespace {
thread_local current_context_slot tls_current;

/// The common path of the root (Note [context actor]): whether every first attempt answered
/// `done`, read here (the caller reads its own responses; no actor hop before it wakes), each
/// wait bounded by its attempt's deadline. False at the first other outcome: the actor decides.
bool first_attempts_done(const container_options& opts, const propagation_outbox& outbox) {
  for (const auto& p : outbox.started) {
    if (!p.first.wait(opts.propagate_timeout + std::chrono::seconds(1))) return false;
    try {
      if (std::get<0>(p.first.get()) != propagate_done) return false;
    } catch (const error&) {
      return false;
    }
  }
  return true;
}

/// Hands a run whose propagations all ended `done` to the actor for its bookkeeping (no answer).
propagate_answer hand_over_done(const caf::actor& a, propagation_outbox& outbox) {
  caf::anon_send(caf::actor_cast<context_handle>(a),
                 ctx_await{outbox.group, std::move(outbox.started), {propagate_done, 0, {}}, {0, 0}, nullptr});
  return {propagate_done, 0, {}};
}

/// Blocks (bounded by propagation_bound) until the actor `a` of context `id` answers for the
/// propagations `outbox` handed it; a missing answer is a timeout.
propagate_answer await_group(const container::impl& c, const caf::actor& a, context_id id,
                             propagation_outbox& outbox) {
  answer_waiter<propagate_answer> w;
  caf::anon_send(caf::actor_cast<context_handle>(a),
                 ctx_await{outbox.group, std::move(outbox.started), {propagate_done, 0, {}}, {0, 0},
                           w.callback({propagate_failed, static_cast<std::int32_t>(errc::invalid_state),
                                       "dist_autograd::backward: context " + std::to_string(id) + " ended during it"})});
  propagate_answer outcome;
  if (!w.wait_for(propagation_bound(c.opts), outcome))
    outcome = {propagate_failed, static_cast<std::int32_t>(errc::timeout),
               "dist_autograd::backward on " + c.n.info().name + ": context " + std::to_string(id) +
                   " got no answer from its actor within the bound"};
  return outcome;
}

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
  if (!slot) {
    slot = std::make_shared<context_state>(id);
    actors[id] = caf::actor_cast<caf::actor>(spawn_context_actor(n, opts, slot));
  }
  return slot;
}

message_id container::impl::record_send(context_state& ctx, const tensor_list& tensors, const std::string& to) {
  edge_list edges;
  std::vector<troupe::device> devices;
  for (const auto& t : tensors) {
    edges.push_back(t.defined() && t.requires_grad() ? gradient_edge(t) : edge{});
    devices.push_back(t.defined() ? t.device() : cpu_device);
  }
  const message_id msg = new_id();
  auto send = std::make_shared<send_function>(std::move(edges), std::move(devices));
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
    if (!run || !run->outbox || !self) throw error(errc::invalid_state, "dist_autograd: a recv function ran outside a distributed backward");
    // Note [context actor]: the first attempt goes from here; the run's caller hands it to the
    // actor (which retries it and keeps an ack that came first) and awaits it there.
    const std::uint64_t seq = self->new_id();
    auto first = send_propagate_attempt(self->n, self->opts, caf::actor_cast<context_handle>(run->outbox->actor), id,
                                        seq, 1, from, msg, run->pass, grads, run->retain);
    run->outbox->started.push_back({seq, from, msg, run->pass, run->retain, grads, std::move(first)});
  };
  auto recv = std::make_shared<recv_function>(num, from, std::move(propagate));
  std::lock_guard<std::mutex> lock(ctx.m);
  ctx.recvs.emplace(msg, recv);
  ctx.workers.insert(from);
  return recv;
}

caf::actor container::impl::actor_of(context_id id) const {
  std::lock_guard<std::mutex> lock(m);
  auto it = actors.find(id);
  return it == actors.end() ? caf::actor{} : it->second;
}

// ---- container ------------------------------------------------------------------------------

container::container(node& n, container_options opts) : impl_(std::make_shared<impl>(n, opts)) {
  std::weak_ptr<impl> weak = impl_;
  // It answers through a deferred reply (Note [context actor]): no executor thread waits for
  // another worker. The release's function: release.cpp.
  n.functions().add(propagate_name, [weak](std::uint64_t id, std::uint64_t msg, std::uint64_t pass,
                                           std::int32_t /*attempt*/, tensor_list grads, bool retain) {
    auto self = weak.lock();
    if (!self) throw rpc::reply_error(errc::invalid_state, "dist_autograd: no container on this worker");
    self->on_propagate(id, msg, pass, grads, retain);
    return rpc::deferred{};
  });
  add_release_function(impl_);
  add_optimizer_functions(impl_);
  impl_->recorder = make_recorder(impl_);
  n.set_interceptor(impl_->recorder);
}

std::shared_ptr<rpc::call_interceptor> container::interceptor() const { return impl_->recorder; }

container::~container() {
  impl_->n.set_interceptor(nullptr);
  std::vector<context_handle> actors;
  {
    std::lock_guard<std::mutex> lock(impl_->m);
    for (auto& [id, a] : impl_->actors) actors.push_back(caf::actor_cast<context_handle>(a));
    impl_->actors.clear();
    impl_->contexts.clear();
  }
  stop_context_actors(impl_->n, actors);  // before the node goes (node::system()'s rule)
}

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
  impl_->n.fault_point("backward", impl_->backwards++);  // Note [fault events]
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
  // Note [flight recorder]: the backward is recorded from its start to its last propagation.
  trace_scope traced(&impl_->n.recorder(), trace_kind::backward, "dist_backward", ctx_id,
                     std::to_string(roots.size()) + (roots.size() == 1 ? " root" : " roots"));
  const caf::actor a = impl_->actor_of(ctx_id);
  propagation_outbox outbox{a, impl_->new_id(), {}};
  std::exception_ptr err;
  try {
    execute_fast(*ctx, impl_->new_id(), retain_graph, root, {}, outbox);
  } catch (...) {
    err = std::current_exception();
  }
  if (!outbox.started.empty()) {  // Note [context actor]: the actor answers once they all ended
    const propagate_answer outcome = first_attempts_done(impl_->opts, outbox)
                                         ? hand_over_done(a, outbox)
                                         : await_group(*impl_, a, ctx_id, outbox);
    if (!err && std::get<0>(outcome) == propagate_failed)
      err = std::make_exception_ptr(error(static_cast<errc>(std::get<1>(outcome)), std::get<2>(outcome)));
  }
  if (!err) return;
  traced.fail();
  // A failed backward releases the context on the other workers, keeps it here.
  release_through(impl_->opts, caf::actor_cast<context_handle>(a), std::string(), /*final=*/false);
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
