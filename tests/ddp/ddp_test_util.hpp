#pragma once
// Models and data of the DDP tests (float64, so comparisons against a single process are tight).

#include <memory>

#include "ddp/ddp_harness.hpp"
#include "troupe/autograd/nn/activation.hpp"
#include "troupe/autograd/nn/linear.hpp"
#include "troupe/autograd/nn/loss.hpp"
#include "troupe/autograd/nn/sequential.hpp"
#include "troupe/autograd/optim/sgd.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/ddp/distributed_data_parallel.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/nn_ops.hpp"

namespace troupe::test {

inline const tensor_options f64{dtype::float64};

/// Linear(6, 8) -> ReLU -> Linear(8, 4), initialised from `seed`.
inline std::shared_ptr<nn::sequential> make_mlp(std::uint64_t seed) {
  generator g(seed);
  auto m = std::make_shared<nn::sequential>();
  m->push_back(std::make_shared<nn::linear>(6, 8, g, true, f64));
  m->push_back(std::make_shared<nn::relu>());
  m->push_back(std::make_shared<nn::linear>(8, 4, g, true, f64));
  return m;
}

/// The batch of `rank` at `step`: x [4, 6], y [4, 4].
inline std::pair<tensor, tensor> batch(int step, int rank) {
  generator g(static_cast<std::uint64_t>(1000 + step * 64 + rank));
  return {randn({4, 6}, g, f64), randn({4, 4}, g, f64)};
}

/// All parameters flattened into one float64 tensor.
inline tensor flat_params(const nn::module& m) {
  tensor_list ps;
  for (const auto& p : m.parameters()) ps.push_back(p.detach().reshape({-1}));
  return cat(ps, 0).clone();
}

/// All gradients flattened (zeros for a parameter without one).
inline tensor flat_grads(const nn::module& m) {
  tensor_list gs;
  for (const auto& p : m.parameters()) {
    const tensor g = grad(p);
    gs.push_back(g.defined() ? g.reshape({-1}) : zeros({p.numel()}, {p.dtype()}));
  }
  return cat(gs, 0).clone();
}

/// Largest |a - b| / max(1, |b|).
inline double max_rel_diff(const tensor& a, const tensor& b) {
  const tensor da = a.to(dtype::float64), db = b.to(dtype::float64);
  double worst = 0;
  for (std::int64_t i = 0; i < da.numel(); ++i) {
    const double x = da.data<double>()[i], y = db.data<double>()[i];
    worst = std::max(worst, std::abs(x - y) / std::max(1.0, std::abs(y)));
  }
  return worst;
}

/// True when `t` is bitwise equal on every rank of `pg`.
inline bool same_on_all_ranks(ddp::process_group& pg, const tensor& t) {
  tensor all = zeros({t.numel() * pg.world_size()}, {t.dtype()});
  pg.allgather(all, t.contiguous()).wait(std::chrono::seconds(20));
  const auto bytes = t.nbytes();
  const auto* base = static_cast<const char*>(all.data_ptr());
  for (int r = 1; r < pg.world_size(); ++r)
    if (std::memcmp(base, base + r * bytes, bytes) != 0) return false;
  return true;
}

}  // namespace troupe::test
