// The distributed optimizer (Note [distributed optimizer] in troupe/dist_autograd/optimizer.hpp).
#include "troupe/dist_autograd/optimizer.hpp"

#include <map>
#include <memory>
#include <mutex>

#include "container_impl.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::dist_autograd {

namespace {
constexpr const char* create_name = "__troupe_dist_autograd_optim_create";
constexpr const char* step_name = "__troupe_dist_autograd_optim_step";
constexpr const char* drop_name = "__troupe_dist_autograd_optim_drop";

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

void add_optimizer_functions(const std::shared_ptr<container::impl>& c) {
  c->owned = std::make_shared<owner_state>();
  std::weak_ptr<container::impl> weak = c;
  auto self = [weak] {
    auto s = weak.lock();
    if (!s) throw error(errc::invalid_state, "dist_autograd optimizer: no container on this worker");
    return s;
  };
  c->n.functions().add(create_name, [self](std::uint64_t id, std::int32_t kind, std::vector<double> h,
                                           std::vector<std::string> keys) {
    auto s = self();
    s->owned->create(*s, id, kind, h, keys);
    return std::int32_t{0};
  });
  c->n.functions().add(step_name, [self](std::uint64_t id, std::uint64_t ctx) {
    auto s = self();
    return s->owned->apply(*s, id, ctx);
  });
  c->n.functions().add(drop_name, [weak](std::uint64_t id) {
    if (auto s = weak.lock()) {
      std::lock_guard<std::mutex> lock(s->owned->m);
      s->owned->optimizers.erase(id);
    }
    return std::int32_t{0};
  });
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
  auto& n = dist.this_node();
  std::vector<rpc::future<std::int32_t>> created;
  for (const auto& [owner, keys] : by_owner) {
    owners_.push_back(owner);
    created.push_back(rpc_async<std::int32_t>(n, owner, create_name, id_, static_cast<std::int32_t>(spec.type),
                                              hyperparameters(spec), keys));
  }
  std::exception_ptr first;
  for (auto& f : created) {
    try {
      f.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

distributed_optimizer::~distributed_optimizer() {
  auto& n = dist_.this_node();
  for (const auto& owner : owners_) {
    try {
      rpc_sync<std::int32_t>(n, owner, drop_name, rpc::deadline{std::chrono::seconds(2)}, id_);
    } catch (...) {  // best effort: the owner may be gone
    }
  }
}

std::size_t distributed_optimizer::step(context_id ctx) {
  auto& n = dist_.this_node();
  std::vector<rpc::future<std::int32_t>> steps;
  for (const auto& owner : owners_) steps.push_back(rpc_async<std::int32_t>(n, owner, step_name, id_, ctx));
  std::exception_ptr first;
  std::size_t updated = 0;
  for (auto& f : steps) {
    try {
      updated += static_cast<std::size_t>(f.get());
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
  return updated;
}

}  // namespace troupe::dist_autograd
