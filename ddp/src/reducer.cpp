// The DDP reducer (Note [DDP reducer]).
#include "reducer.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include <caf/all.hpp>

#include "troupe/autograd/grad_node.hpp"
#include "troupe/autograd/variable.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::ddp::detail {

namespace {

/// CAF 0.17 keeps the actor system's logger in a thread-local of every thread that spawns an
/// actor or makes a scoped_actor. ~actor_system waits for it, so the user thread drops it.
struct logger_release {
  logger_release() = default;
  logger_release(const logger_release&) = delete;
  logger_release& operator=(const logger_release&) = delete;
  ~logger_release() { caf::logger::set_current_actor_system(nullptr); }
};

}  // namespace

std::vector<std::vector<std::size_t>> assign_buckets(const tensor_list& params, const std::vector<std::size_t>& order,
                                                     double first_cap_mb, double cap_mb) {
  std::vector<std::vector<std::size_t>> out;
  std::vector<std::size_t> current;
  std::size_t bytes = 0;
  auto cap = [&] { return static_cast<std::size_t>((out.empty() ? first_cap_mb : cap_mb) * 1024.0 * 1024.0); };
  for (std::size_t i : order) {
    if (!current.empty() && params[i].dtype() != params[current.front()].dtype()) {
      out.push_back(std::move(current));
      current.clear();
      bytes = 0;
    }
    current.push_back(i);
    bytes += params[i].nbytes();
    if (bytes >= cap()) {
      out.push_back(std::move(current));
      current.clear();
      bytes = 0;
    }
  }
  if (!current.empty()) out.push_back(std::move(current));
  return out;
}

reducer::reducer(tensor_list params, std::vector<std::string> names, collective_group& group, const ddp_options& opts,
                 caf::actor_system* system)
    : params_(std::move(params)),
      names_(std::move(names)),
      group_(group),
      opts_(opts),
      system_(system),
      shared_(std::make_shared<bucket_shared>(group)) {
  if (system_ == nullptr) {
    // One scheduler thread keeps the gradient path off other work and costs one thread.
    own_cfg_ = std::make_unique<caf::actor_system_config>();
    own_cfg_->set("scheduler.policy", caf::atom("sharing"));
    own_cfg_->set("scheduler.max-threads", std::size_t{1});
    own_cfg_->set("logger.console", caf::atom("none"));
    own_system_ = std::make_unique<caf::actor_system>(*own_cfg_);
    system_ = own_system_.get();
  }
  shared_->hook = allreduce_hook();
  shared_->events.reset(group_.device(), params_.size());
  ready_.assign(params_.size(), false);
  locally_used_.assign(params_.size(), 0);
}

reducer::~reducer() {
  drain();
  stop_actors();
  own_system_.reset();
}

void reducer::stop_actors() noexcept {
  if (actors_.empty()) return;
  try {
    logger_release release;
    caf::scoped_actor self{*system_};
    for (auto& a : actors_) {
      self->monitor(a);
      self->send_exit(a, caf::exit_reason::user_shutdown);
    }
    const auto deadline = std::chrono::steady_clock::now() + opts_.timeout;
    for (std::size_t down = 0; down < actors_.size();) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;  // an actor stuck in a hook: give up waiting, not hang
      self->receive([&](caf::down_msg&) { ++down; }, caf::after(left) >> [] {});
    }
  } catch (...) {  // stopping is best effort; the actors hold only shared state
  }
  actors_.clear();
}

void reducer::detach() noexcept {
  detached_.store(true);
  drain();
  stop_actors();
}

void reducer::check_attached(const char* what) const {
  if (detached_.load(std::memory_order_relaxed))
    throw error(errc::invalid_state, std::string("distributed_data_parallel: ") + what +
                                         ": the node that runs its bucket actors (ddp_options::node) is shut down");
}

void reducer::build(const std::vector<std::vector<std::size_t>>& assignment) {
  check_attached("rebuilding the buckets");
  stop_actors();
  buckets_.clear();
  std::vector<grad_bucket> views;
  slot_of_.assign(params_.size(), {0, 0});
  for (std::size_t b = 0; b < assignment.size(); ++b) {
    bucket bk;
    bk.dtype = params_[assignment[b].front()].dtype();
    std::int64_t n = 0;
    for (std::size_t i : assignment[b]) {
      slot_of_[i] = {b, bk.params.size()};
      bk.params.push_back(i);
      bk.offsets.push_back(n);
      n += params_[i].numel();
    }
    bk.buffer = opts_.shared_buckets ? group_.make_buffer({n}, bk.dtype) : zeros({n}, {bk.dtype, group_.device()});
    grad_bucket gb;
    gb.index = static_cast<int>(b);
    gb.buffer = bk.buffer;
    for (std::size_t k = 0; k < bk.params.size(); ++k) {
      const tensor& p = params_[bk.params[k]];
      bk.views.push_back(bk.buffer.narrow(0, bk.offsets[k], p.numel()).view(p.shape()));
      gb.parameters.push_back(p);
      gb.offsets.push_back(bk.offsets[k]);
    }
    buckets_.push_back(std::move(bk));
    views.push_back(std::move(gb));
  }
  shared_->board.open(buckets_.size());
  logger_release release;
  bucket_actor next;
  actors_.resize(buckets_.size());
  for (std::size_t b = buckets_.size(); b-- > 0;) {
    bucket_spec spec{static_cast<int>(b), buckets_[b].params, std::move(views[b]), next};
    actors_[b] = spawn_bucket_actor(*system_, std::move(spec), shared_);
    next = actors_[b];
  }
}

std::vector<bool> reducer::reachable(const tensor_list& outputs) const {
  std::unordered_map<const tensor_impl*, std::size_t> index;
  for (std::size_t i = 0; i < params_.size(); ++i) index.emplace(params_[i].impl().get(), i);
  std::vector<bool> used(params_.size(), false);
  std::unordered_set<const grad_node*> seen;
  std::vector<std::shared_ptr<grad_node>> stack;
  for (const auto& o : outputs) {
    if (!o.defined()) continue;
    if (auto it = index.find(o.impl().get()); it != index.end()) used[it->second] = true;
    if (auto fn = grad_fn(o)) stack.push_back(std::move(fn));
  }
  while (!stack.empty()) {
    auto n = std::move(stack.back());
    stack.pop_back();
    if (!seen.insert(n.get()).second) continue;
    if (auto* acc = dynamic_cast<const accumulate_grad*>(n.get())) {
      if (auto it = index.find(acc->variable().impl().get()); it != index.end()) used[it->second] = true;
    }
    for (const auto& e : n->next_edges())
      if (e.fn) stack.push_back(e.fn);
  }
  return used;
}

void reducer::prepare(bool sync, const tensor_list& outputs) {
  check_attached("forward");
  armed_ = sync;
  if (!sync) return;
  std::fill(ready_.begin(), ready_.end(), false);
  ready_count_ = 0;
  ready_order_.clear();
  shared_->board.open(buckets_.size());
  armed_at_ = std::chrono::steady_clock::now();
  if (!opts_.find_unused_parameters) return;
  const std::vector<bool> used = reachable(outputs);
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!used[i]) mark_ready(i);
}

void reducer::on_grad_ready(std::size_t i) {
  locally_used_[i] = 1;  // also under no_sync: the accumulated gradient is part of the next sum
  if (!armed_) return;    // no_sync, or a backward without a DDP forward
  check_attached("backward");
  if (ready_count_ == 0) group_.fault_point("backward", step_.load(std::memory_order_relaxed));  // the first gradient of this backward
  if (ready_[i])
    throw error(errc::autograd_error, "distributed_data_parallel: parameter '" + names_[i] +
                                          "' was marked ready twice in one iteration (was it marked unused by "
                                          "find_unused_parameters but still got a gradient, or used by two backward passes?)");
  mark_ready(i);
}

void reducer::mark_ready(std::size_t i) {
  no_grad_guard guard;
  const auto [b, k] = slot_of_[i];
  tensor& view = buckets_[b].views[k];
  // A parameter marked unused contributes its current .grad as well (zeros when undefined):
  // what no_sync accumulated must not be lost (PyTorch does the same).
  const tensor g = grad(params_[i]);
  if (!g.defined()) view.zero_();
  else if (g.data_ptr() != view.data_ptr()) view.copy_(g);
  shared_->events.record(i);  // Note [DDP on CUDA]
  ready_[i] = true;
  ++ready_count_;
  ready_order_.push_back(i);
  caf::anon_send(actors_[b], grad_ready_atom::value, i, step_.load(std::memory_order_relaxed));
  if (ready_count_ == params_.size()) finalize();
}

work reducer::launch_used_map() {
  tensor used = empty({static_cast<std::int64_t>(params_.size())}, {dtype::uint8});
  std::copy(locally_used_.begin(), locally_used_.end(), used.data<std::uint8_t>());
  if (group_.device() != used.device()) used = used.to(group_.device());
  used_map_ = used;
  group_.note_next("unused parameters");
  return group_.allreduce(used, reduce_op::max);
}

void reducer::finalize() {
  armed_ = false;
  ++iterations_;
  const auto last_grad = std::chrono::steady_clock::now();
  auto filled = shared_->board.wait_filled(buckets_.size(), opts_.timeout);
  if (!filled)
    throw error(errc::timeout, "distributed_data_parallel: only " + std::to_string(shared_->board.filled()) + " of " +
                                   std::to_string(buckets_.size()) + " buckets launched their reduction within " +
                                   std::to_string(opts_.timeout.count()) + " ms");
  std::vector<std::optional<comm_result>> results = std::move(*filled);
  // Issued after every bucket launched: the same collective order on every rank.
  std::vector<std::uint8_t> globally_used(params_.size(), 1);
  work used_work;
  if (opts_.find_unused_parameters) used_work = launch_used_map();
  std::fill(locally_used_.begin(), locally_used_.end(), 0);
  no_grad_guard guard;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    auto& r = *results[b];
    if (r.pending.valid()) r.pending.wait(opts_.timeout);
    if (r.then) r.then();
    group_.fault_point("allreduce_done", step_.load(std::memory_order_relaxed));
    // Without a used map, bucket b's copy back overlaps the reduction of bucket b + 1.
    if (!used_work.valid()) write_back(buckets_[b], globally_used);
  }
  if (used_work.valid()) {
    used_work.wait(opts_.timeout);
    const tensor used = used_map_.cpu();
    std::copy_n(used.data<std::uint8_t>(), params_.size(), globally_used.begin());
    for (auto& bk : buckets_) write_back(bk, globally_used);
  }
  record_timeline(results, last_grad);
}

void reducer::record_timeline(const std::vector<std::optional<comm_result>>& results,
                              std::chrono::steady_clock::time_point last_grad) {
  auto ms = [&](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(t - armed_at_).count();
  };
  const auto launched_at = shared_->board.launched_at();
  reduction_timeline t;
  for (std::size_t b = 0; b < results.size(); ++b) {
    t.launched_ms.push_back(ms(launched_at[b]));
    const auto done = results[b]->pending.completed_at();
    t.completed_ms.push_back(done ? ms(*done) : ms(launched_at[b]));
  }
  t.last_grad_ms = ms(last_grad);
  t.finished_ms = ms(std::chrono::steady_clock::now());
  std::lock_guard<std::mutex> lock(mu_);
  timeline_ = std::move(t);
}

reduction_timeline reducer::timeline() const {
  std::lock_guard<std::mutex> lock(mu_);
  return timeline_;
}

void reducer::write_back(bucket& bk, const std::vector<std::uint8_t>& globally_used) {
  for (std::size_t k = 0; k < bk.params.size(); ++k) {
    if (globally_used[bk.params[k]] == 0) continue;  // unused on every rank: .grad untouched
    const tensor& p = params_[bk.params[k]];
    const tensor g = grad(p);
    if (opts_.gradient_as_bucket_view) {
      if (!g.defined() || g.data_ptr() != bk.views[k].data_ptr()) set_grad(p, bk.views[k]);
    } else if (g.defined()) {
      tensor(g).copy_(bk.views[k]);
    } else {
      set_grad(p, bk.views[k].clone());
    }
  }
}

void reducer::drain() noexcept {
  // Buckets whose reductions were launched: the leading complete ones (launch is in order).
  std::size_t expected = 0;
  for (; expected < buckets_.size(); ++expected) {
    const auto& ps = buckets_[expected].params;
    if (!std::all_of(ps.begin(), ps.end(), [&](std::size_t i) { return ready_[i]; })) break;
  }
  (void)shared_->board.wait_filled(expected, opts_.timeout);
  for (auto& r : shared_->board.slots())  // what launched, also after a timeout
    if (r && r->pending.valid()) {
      try {
        r->pending.wait(opts_.timeout);
      } catch (...) {  // the caller reports the unfinished iteration, not this
      }
    }
  for (auto& a : actors_) caf::anon_send(a, reset_atom::value);
}

void reducer::check_previous_finished() {
  if (!armed_ || ready_count_ == 0) return;
  std::string missing;
  for (std::size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) missing += (missing.empty() ? "'" : ", '") + names_[i] + "'";
  drain();
  armed_ = false;
  throw error(errc::autograd_error,
              "distributed_data_parallel: expected to have finished reduction in the prior iteration before starting "
              "a new one: parameter(s) " + missing + " received no gradient in the last backward on rank " +
                  std::to_string(group_.rank()) + ". If your forward does not use every parameter, pass "
                  "find_unused_parameters=true to distributed_data_parallel (ddp_options); also make sure every "
                  "forward output takes part in computing the loss.");
}

std::vector<std::vector<std::size_t>> reducer::assignment() const {
  std::vector<std::vector<std::size_t>> out;
  for (const auto& b : buckets_) out.push_back(b.params);
  return out;
}

std::vector<int> reducer::launch_order() const { return shared_->board.order(); }

}  // namespace troupe::ddp::detail
