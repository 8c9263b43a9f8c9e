#pragma once
/// \file optimizer.hpp
/// The distributed optimizer: parameters named by rref<tensor>, updated on their owners from the
/// gradients of a distributed autograd context.
///
///   // on the owner (a parameter server):
///   troupe::rref<tensor> w = troupe::dist_autograd::make_parameter(rctx, dist, troupe::randn({4, 2}, gen));
///   tensor live = troupe::dist_autograd::local_parameter(dist, w);   // use it in the forward
///   // on a trainer holding the rrefs:
///   troupe::dist_autograd::distributed_optimizer opt(dist, optimizer_spec::make_sgd({.lr = 0.05}), params);
///   { context ctx(dist); ...forward through RPC...; dist.backward(ctx.id(), {loss}); opt.step(ctx.id()); }
///
/// Note [distributed optimizer]
/// A parameter is a live leaf tensor on its owner. It is registered in the owner's container
/// under the id of an owner-local rref<tensor> (make_parameter). Functions on the owner use the
/// leaf itself (local_parameter), so gradients recorded by distributed autograd refer to it.
/// Constructing a distributed_optimizer creates one local functional optimizer per owner over
/// the parameters it owns. It does so with an optim_create request to the owner's dist autograd
/// service actor (Note [dist autograd service]). step(ctx) asks every owner at once (optim_step)
/// to apply the gradients that context accumulated there. Steps on one owner are serialised (one
/// mutex per owner); steps on different owners run concurrently. After a step the owner also
/// rewrites the rref's stored value, so to_here() sees the updated parameter. Parameters without
/// a gradient in the context are skipped. Steps are user-visible updates and are NOT retried (a
/// lost step fails with timeout / peer_lost).
///
///   trainer --optim_step{opt, ctx}--> owner A service: grads of ctx on A -> sgd/adam step -> optim_reply
///          \--optim_step{opt, ctx}--> owner B service: ...                                 -> optim_reply

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/actors/rref/rref.hpp"
#include "troupe/autograd/optim/adam.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/dist_autograd/container.hpp"

namespace troupe::dist_autograd {

/// Which local optimizer each owner runs, and its options.
struct optimizer_spec {
  enum class kind : std::int32_t { sgd = 0, adam = 1, adamw = 2 };
  kind type = kind::sgd;
  optim::sgd_options sgd;    ///< used when type == sgd
  optim::adam_options adam;  ///< used when type == adam or adamw

  static optimizer_spec make_sgd(optim::sgd_options o) { return {kind::sgd, o, {}}; }
  static optimizer_spec make_adam(optim::adam_options o) { return {kind::adam, {}, o}; }
  static optimizer_spec make_adamw(optim::adam_options o = optim::adamw_options()) { return {kind::adamw, {}, o}; }
};

/// Registers `value` (made a leaf that requires grad) as a parameter owned by this worker and
/// returns an owner-local rref to it (Note [distributed optimizer]). `rc` and `dist` belong to
/// the same node and must outlive the parameter. Throws bad_argument for an undefined or
/// non-floating value.
rref<tensor> make_parameter(rref_context& rc, container& dist, tensor value);

/// The live parameter named by `p`, on its owner. Throws bad_argument when `p` is not a
/// parameter registered on this worker.
tensor local_parameter(container& dist, const rref<tensor>& p);

/// One local optimizer per owner of `params`; step(ctx) updates every owner from context `ctx`.
class distributed_optimizer {
 public:
  /// Creates the local optimizers (blocks for one round trip per owner, in parallel). Throws
  /// bad_argument (empty list, a parameter unknown on its owner), peer_lost, timeout.
  distributed_optimizer(container& dist, optimizer_spec spec, const std::vector<rref<tensor>>& params);
  /// Drops the owners' optimizers (best effort, bounded).
  ~distributed_optimizer();
  distributed_optimizer(const distributed_optimizer&) = delete;
  distributed_optimizer& operator=(const distributed_optimizer&) = delete;

  /// Applies the gradients of `ctx` on every owner concurrently; blocks until all finished.
  /// Returns the number of parameters updated. Throws the first owner's error (remote_exception,
  /// peer_lost, timeout) after every owner answered.
  std::size_t step(context_id ctx);

 private:
  container& dist_;
  std::uint64_t id_;
  std::vector<std::string> owners_;
};

}  // namespace troupe::dist_autograd
