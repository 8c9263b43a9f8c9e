// The distributed optimizer (Note [distributed optimizer] in troupe/dist_autograd/optimizer.hpp).
#include "troupe/dist_autograd/optimizer.hpp"

#include <bit>
#include <map>
#include <memory>
#include <mutex>

#include <caf/all.hpp>

#include "container_impl.hpp"
#include "service.hpp"
#include "troupe/actors/error_caf.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::dist_autograd {

namespace {

/// A parameter owned here: the live leaf, which its rref holds too (the same tensor, so an
/// in-place step is what a later to_here sees).
struct owned_parameter {
  tensor leaf;
};

/// One owner's local optimizer of a distributed_optimizer.
struct owned_optimizer {
  std::vector<std::string> keys;
  std::unique_ptr<optim::optimizer> opt;
};

std::unique_ptr<optim::optimizer> make_local(optimizer_spec::kind kind, const std::vector<double>& h, tensor_list params) {
  if (h.size() != 6) throw error(errc::bad_argument, "dist_autograd optimizer: malformed hyperparameters");
  if (kind == optimizer_spec::kind::sgd) {
    optim::sgd_options o{h[0], h[1], h[2], h[3], h[4] != 0};
    return std::make_unique<optim::sgd>(std::move(params), o);
  }
  optim::adam_options o{h[0], h[1], h[2], h[3], h[4]};
  if (kind == optimizer_spec::kind::adam) return std::make_unique<optim::adam>(std::move(params), o);
  if (kind == optimizer_spec::kind::adamw) return std::make_unique<optim::adamw>(std::move(params), o);
  throw error(errc::bad_argument, "dist_autograd optimizer: unknown optimizer kind " +
                                      std::to_string(static_cast<int>(kind)));
}

/// One optimizer message to the service of `owner`.
struct ask {
  std::string owner;
  caf::message msg;
};

/// Sends every ask at once from a scoped actor and waits for each reply (each bounded by
/// `timeout`); the replies' values, in order. Throws the first error, naming its owner. Never
/// retried: a step is a user-visible update.
std::vector<std::int32_t> ask_owners(container::impl& c, const std::vector<ask>& asks, std::chrono::milliseconds timeout) {
  caf::scoped_actor self{c.n.system()};
  std::vector<std::int32_t> out(asks.size(), 0);
  std::exception_ptr first;
  using handle = decltype(self->request(caf::actor{}, timeout, caf::message{}));
  std::vector<std::pair<std::size_t, handle>> pending;
  for (std::size_t i = 0; i < asks.size(); ++i) {
    try {
      pending.emplace_back(i, self->request(c.peer(asks[i].owner), timeout, asks[i].msg));
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  for (auto& [i, h] : pending)
    h.receive([&, i = i](const optim_reply& r) { out[i] = r.value; },
              [&, i = i](const caf::error& e) {
                if (!first) first = std::make_exception_ptr(from_caf_error(e, "dist_autograd optimizer on " + asks[i].owner));
              });
  if (first) std::rethrow_exception(first);
  return out;
}

std::vector<double> hyperparameters(const optimizer_spec& s) {
  if (s.type == optimizer_spec::kind::sgd)
    return {s.sgd.lr, s.sgd.momentum, s.sgd.dampening, s.sgd.weight_decay, s.sgd.nesterov ? 1.0 : 0.0, 0.0};
  return {s.adam.lr, s.adam.beta1, s.adam.beta2, s.adam.eps, s.adam.weight_decay, 0.0};
}
}  // namespace

/// Parameters and optimizers owned by one worker.
struct owner_state {
  std::mutex m;     // guards the maps
  std::mutex step;  // serialises optimizer steps on this owner
  std::map<std::string, owned_parameter> params;
  std::map<std::uint64_t, std::shared_ptr<owned_optimizer>> optimizers;

  void create(container::impl& c, std::uint64_t id, std::int32_t kind, const std::vector<double>& h,
              const std::vector<std::string>& keys) {
    tensor_list leaves;
    {
      std::lock_guard<std::mutex> lock(m);
      for (const auto& k : keys) {
        auto it = params.find(k);
        if (it == params.end())
          throw error(errc::bad_argument, "dist_autograd optimizer: " + k + " is not a parameter owned by " + c.n.info().name);
        leaves.push_back(it->second.leaf);
      }
    }
    auto o = std::make_shared<owned_optimizer>();
    o->keys = keys;
    o->opt = make_local(static_cast<optimizer_spec::kind>(kind), h, std::move(leaves));
    std::lock_guard<std::mutex> lock(m);
    optimizers[id] = std::move(o);
  }

  std::int32_t apply(container::impl& c, std::uint64_t id, context_id ctx_id) {
    std::lock_guard<std::mutex> serial(step);
    std::shared_ptr<owned_optimizer> o;
    std::vector<owned_parameter> ps;
    {
      std::lock_guard<std::mutex> lock(m);
      auto it = optimizers.find(id);
      if (it == optimizers.end())
        throw error(errc::bad_argument, "dist_autograd optimizer: no optimizer " + std::to_string(id) + " on " + c.n.info().name);
      o = it->second;
      for (const auto& k : o->keys) ps.push_back(params.at(k));
    }
    auto ctx = c.find_if(ctx_id);
    if (!ctx) return 0;  // this owner took no part in the context: no gradients
    gradient_map grads;
    {
      std::lock_guard<std::mutex> lock(ctx->m);
      grads = ctx->grads;
    }
    tensor_list params_in, grads_in;
    std::int32_t updated = 0;
    for (const auto& p : ps) {
      params_in.push_back(p.leaf);
      grads_in.push_back(grads.contains(p.leaf) ? grads.at(p.leaf) : tensor());
      updated += grads.contains(p.leaf) ? 1 : 0;
    }
    o->opt->step(params_in, grads_in);  // in place: the rref holds this same leaf, live
    return updated;
  }
};

void add_optimizer_state(container::impl& c) { c.owned = std::make_shared<owner_state>(); }

void create_optimizer(container::impl& c, std::uint64_t id, std::int32_t kind, const std::vector<double>& h,
                      const std::vector<std::string>& keys) {
  c.owned->create(c, id, kind, h, keys);
}

std::int32_t step_optimizer(container::impl& c, std::uint64_t id, context_id ctx) { return c.owned->apply(c, id, ctx); }

void drop_optimizer(container::impl& c, std::uint64_t id) {
  std::lock_guard<std::mutex> lock(c.owned->m);
  c.owned->optimizers.erase(id);
}

rref<tensor> make_parameter(rref_context& rc, container& dist, tensor value) {
  if (!value.defined() || !is_floating(value.dtype()))
    throw error(errc::bad_argument, "dist_autograd::make_parameter: the value must be a defined floating tensor");
  value = value.detach();
  set_requires_grad(value);
  rref<tensor> r = make_rref(rc, value);
  const auto& c = container_access::of(dist);
  std::lock_guard<std::mutex> lock(c->owned->m);
  c->owned->params[r.id().str()] = owned_parameter{value};
  return r;
}

tensor local_parameter(container& dist, const rref<tensor>& p) {
  const auto& c = container_access::of(dist);
  std::lock_guard<std::mutex> lock(c->owned->m);
  auto it = c->owned->params.find(p.id().str());
  if (it == c->owned->params.end())
    throw error(errc::bad_argument, "dist_autograd::local_parameter: " + p.id().str() + " is not a parameter owned by " +
                                        c->n.info().name);
  return it->second.leaf;
}

// ---- distributed_optimizer ---------------------------------------------------------------------

distributed_optimizer::distributed_optimizer(container& dist, optimizer_spec spec, const std::vector<rref<tensor>>& params)
    : dist_(dist), id_(container_access::of(dist)->new_id()) {
  if (params.empty()) throw error(errc::bad_argument, "distributed_optimizer: no parameters");
  std::map<std::string, std::vector<std::string>> by_owner;
  for (const auto& p : params) by_owner[p.owner()].push_back(p.id().str());
  std::vector<std::uint64_t> bits;
  for (double h : hyperparameters(spec)) bits.push_back(std::bit_cast<std::uint64_t>(h));
  std::vector<ask> asks;
  for (const auto& [owner, keys] : by_owner) {
    owners_.push_back(owner);
    asks.push_back({owner, caf::make_message(optim_create{id_, static_cast<std::int32_t>(spec.type), bits, keys})});
  }
  ask_owners(*container_access::of(dist), asks, dist.this_node().default_timeout());
}

distributed_optimizer::~distributed_optimizer() {
  std::vector<ask> asks;
  for (const auto& owner : owners_) asks.push_back({owner, caf::make_message(optim_drop{id_})});
  try {
    ask_owners(*container_access::of(dist_), asks, std::chrono::seconds(2));
  } catch (...) {  // best effort: an owner may be gone
  }
}

std::size_t distributed_optimizer::step(context_id ctx) {
  std::vector<ask> asks;
  for (const auto& owner : owners_) asks.push_back({owner, caf::make_message(optim_step{id_, ctx})});
  std::size_t updated = 0;
  for (auto n : ask_owners(*container_access::of(dist_), asks, dist_.this_node().default_timeout()))
    updated += static_cast<std::size_t>(n);
  return updated;
}

}  // namespace troupe::dist_autograd
