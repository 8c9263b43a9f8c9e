// The container and its contexts' RAII (Notes [dist autograd recording] in container.hpp and
// [FAST mode backward] in fast_engine.hpp); the state they share is container::impl
// (container_impl.cpp).
#include "troupe/dist_autograd/container.hpp"

#include <algorithm>
#include <thread>

#include <caf/all.hpp>

#include "container_impl.hpp"
#include "context_actor.hpp"
#include "direct_requester.hpp"
#include "fast_engine.hpp"
#include "service.hpp"
#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/remote_actor.hpp"
#include "troupe/autograd/autograd_meta.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/error.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::dist_autograd {

namespace {
thread_local current_context_slot tls_current;

/// Blocks (bounded by propagation_bound) until the actor `a` of context `id` answers for the
/// propagations `outbox` handed it; a missing answer is a timeout.
propagate_answer await_group(const container::impl& c, const caf::actor& a, context_id id,
                             const propagation_outbox& outbox) {
  answer_waiter<propagate_answer> w;
  caf::anon_send(caf::actor_cast<context_handle>(a),
                 ctx_await{outbox.group, outbox.started, {propagate_done, 0, {}}, {0, 0},
                           w.callback({propagate_failed, static_cast<std::int32_t>(errc::invalid_state),
                                       "dist_autograd::backward: context " + std::to_string(id) + " ended during it"})});
  propagate_answer outcome;
  if (!w.wait_for(propagation_bound(c.opts), outcome))
    outcome = {propagate_failed, static_cast<std::int32_t>(errc::timeout),
               "dist_autograd::backward on " + c.n.info().name + ": context " + std::to_string(id) +
                   " got no answer from its actor within the bound"};
  return outcome;
}

/// Reads the replies of the first attempts the root's run sent itself, bounded by one attempt's
/// deadline. Hands every one that did not end `done` to the context actor and counts it in
/// `outbox.started`. The actor goes on from that answer (retries, polls, failure).
void hand_over(container::impl& c, context_id id, std::uint64_t pass, bool retain, reply_batch& direct,
               propagation_outbox& outbox) {
  if (outbox.sent.empty()) return;
  const auto replies = direct.wait_until(*c.requester, std::chrono::steady_clock::now() + c.opts.propagate_timeout);
  for (auto& d : outbox.sent) {
    propagate_answer first = first_answer(replies[d.slot], d.to);
    if (std::get<0>(first) == propagate_done) continue;
    if (!outbox.actor) outbox.actor = c.actor_of(id);  // the actor comes only when there is work for it
    caf::anon_send(caf::actor_cast<context_handle>(outbox.actor),
                   ctx_start{outbox.group, d.seq, d.to, d.peer, d.msg, pass, retain, std::move(d.grads), std::move(first)});
    ++outbox.started;
  }
}

/// The graph root of a backward from `roots` (local one-element tensors that require grad).
std::shared_ptr<graph_root> make_root(const tensor_list& roots) {
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
  return std::make_shared<graph_root>(std::move(edges), std::move(grads));
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

// ---- container ------------------------------------------------------------------------------

container::container(node& n, container_options opts) : impl_(std::make_shared<impl>(n, opts)) {
  if (!message_types_announced(n))
    throw error(errc::invalid_state, "dist_autograd::container on " + n.info().name +
                                         ": its message types are not announced; call "
                                         "troupe::dist_autograd::add_message_types(options) before the node starts");
  // Note [dist autograd service]: the peers' context actors reach this worker through it.
  auto service = spawn_service(n, impl_);
  impl_->service = caf::actor_cast<caf::actor>(service);
  try {
    publish_actor(n, caf::actor_cast<service_actor>(service), service_name);
  } catch (...) {
    n.system().registry().erase(service.id());
    stop_actors(n, {impl_->service});
    throw;
  }
  impl_->requester = std::make_shared<direct_requester>(n);
  add_optimizer_state(*impl_);
  impl_->recorder = make_recorder(impl_);
  n.set_interceptor(impl_->recorder);
}

std::shared_ptr<rpc::call_interceptor> container::interceptor() const { return impl_->recorder; }

container::~container() {
  impl_->n.set_interceptor(nullptr);
  std::vector<caf::actor> actors;
  {
    std::lock_guard<std::mutex> lock(impl_->m);
    for (auto& [id, a] : impl_->actors)
      if (a) actors.push_back(a);
    impl_->actors.clear();
    for (auto& w : impl_->retrying)
      if (auto a = caf::actor_cast<caf::actor>(w.lock())) actors.push_back(std::move(a));
    impl_->retrying.clear();
    impl_->contexts.clear();
  }
  {
    std::lock_guard<std::mutex> lock(impl_->peers_m);
    impl_->peers.clear();
  }
  try {
    impl_->n.system().registry().erase(impl_->service.id());  // publish_actor put it there
  } catch (...) {  // the node is gone: its system took the actors with it
  }
  impl_->requester.reset();  // its companion goes; replies still on their way are dropped
  actors.push_back(std::move(impl_->service));
  stop_actors(impl_->n, actors);  // before the node goes (node::system()'s rule)
}

node& container::this_node() noexcept { return impl_->n; }

context_id container::create_context() {
  const context_id id = impl_->new_id();
  impl_->find_or_create(id);
  return id;
}

void container::release(context_id id) { impl_->release_everywhere(id, std::string()); }

bool container::await_releases(std::chrono::milliseconds timeout) { return impl_->await_releases(timeout); }

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
  auto root = make_root(roots);
  // Note [flight recorder]: the backward is recorded from its start to its last propagation.
  trace_scope traced(&impl_->n.recorder(), trace_kind::backward, "dist_backward", ctx_id,
                     std::to_string(roots.size()) + (roots.size() == 1 ? " root" : " roots"));
  reply_batch direct;
  propagation_outbox outbox{caf::actor{}, impl_->new_id(), 0, nullptr, {}};
  outbox.direct = &direct;
  const std::uint64_t pass = impl_->new_id();
  std::exception_ptr err;
  try {
    execute_fast(*ctx, pass, retain_graph, root, {}, outbox);
  } catch (...) {
    err = std::current_exception();
  }
  hand_over(*impl_, ctx_id, pass, retain_graph, direct, outbox);
  if (outbox.started > 0) {  // Note [context actor]: the actor answers once they all ended
    const propagate_answer outcome = await_group(*impl_, outbox.actor, ctx_id, outbox);
    if (!err && std::get<0>(outcome) == propagate_failed)
      err = std::make_exception_ptr(error(static_cast<errc>(std::get<1>(outcome)), std::get<2>(outcome)));
  }
  if (!err) return;
  traced.fail();
  // A failed backward releases the context on the other workers, keeps it here.
  release_through(impl_->opts, caf::actor_cast<context_handle>(impl_->actor_of(ctx_id)),
                  ctx_release{std::string(), /*final=*/false, nullptr,
                              impl_->peers_of(impl_->release_targets(ctx_id, std::string())), {}, {}});
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
    c_.impl_->release_async(id_);  // Note [context actor]: the peers' answers are not awaited
  } catch (...) {  // a destructor never throws; release is best effort by design
  }
}

}  // namespace troupe::dist_autograd
