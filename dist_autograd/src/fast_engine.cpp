// The distributed engine, FAST mode (Note [FAST mode backward] in fast_engine.hpp).
#include "fast_engine.hpp"

#include <queue>
#include <unordered_set>

#include "troupe/autograd/autograd_meta.hpp"
#include "troupe/autograd/engine_steps.hpp"
#include "troupe/tensors/autograd_hook.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::dist_autograd {

namespace {

/// Binds `n`, when it is a recv function, to `run` for the scope's lifetime.
class run_binding {
 public:
  run_binding(grad_node& n, const run_info& run) : recv_(dynamic_cast<recv_function*>(&n)) {
    if (recv_) recv_->bind_run(&run);
  }
  ~run_binding() {
    if (recv_) recv_->bind_run(nullptr);
  }
  run_binding(const run_binding&) = delete;
  run_binding& operator=(const run_binding&) = delete;

 private:
  recv_function* recv_;
};

/// Counts, for every node reachable from `entries`, the edges pointing at it (iteratively).
void compute_dependencies(const std::vector<grad_node*>& entries, graph_pass& pass) {
  std::vector<grad_node*> stack = entries;
  std::unordered_set<grad_node*> seen(entries.begin(), entries.end());
  while (!stack.empty()) {
    grad_node* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next_edges()) {
      if (!e.valid()) continue;
      ++pass.deps[e.fn.get()];
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }
}

/// Starts pass `id` here: dependencies from `root` (may be null) and every send function.
void begin_pass(context_state& ctx, std::uint64_t id, bool retain, grad_node* root) {
  std::vector<std::shared_ptr<send_function>> sends;  // kept alive while counting
  {
    std::lock_guard<std::mutex> lock(ctx.m);
    for (const auto& [msg, s] : ctx.sends) sends.push_back(s);
  }
  ctx.pass = graph_pass{};
  ctx.pass.id = id;
  ctx.pass.retain = retain;
  std::vector<grad_node*> entries;
  if (root) entries.push_back(root);
  for (const auto& s : sends) entries.push_back(s.get());
  compute_dependencies(entries, ctx.pass);
}

/// A leaf's gradient: its tensor hooks run, then it is added to the context (never to .grad).
void capture_leaf(context_state& ctx, accumulate_grad& acc, tensor_list&& in) {
  if (in.empty() || !in[0].defined()) return;
  tensor g = std::move(in[0]);
  if (auto* meta = meta_of(acc.variable())) {
    std::vector<std::pair<std::uint64_t, tensor_hook>> hooks;
    {
      std::lock_guard<std::mutex> lock(meta->mutex);
      hooks = meta->hooks;
    }
    for (const auto& [id, hook] : hooks) {
      tensor r = hook(g);
      if (r.defined()) g = std::move(r);
    }
  }
  std::lock_guard<std::mutex> lock(ctx.m);
  ctx.grads.accumulate(acc.variable(), g);
}

}  // namespace

void execute_fast(context_state& ctx, std::uint64_t pass, bool retain, const std::shared_ptr<grad_node>& entry,
                  tensor_list inputs, propagation_outbox& outbox) {
  no_grad_guard ng;
  std::lock_guard<std::mutex> lock(ctx.run);
  const bool is_root = dynamic_cast<graph_root*>(entry.get()) != nullptr;
  if (ctx.pass.id != pass) begin_pass(ctx, pass, retain, is_root ? entry.get() : nullptr);
  run_info info{ctx.id, pass, retain, &outbox};
  graph_pass& state = ctx.pass;
  std::priority_queue<grad_node*, std::vector<grad_node*>, engine_steps::later_first> queue;
  std::vector<grad_node*> ready;
  tensor_list entry_in = std::move(inputs);
  entry_in.resize(entry->num_inputs());
  bool first = true;
  queue.push(entry.get());
  while (!queue.empty()) {
    grad_node* n = queue.top();
    queue.pop();
    tensor_list in;
    if (first) {
      in = std::move(entry_in);
      first = false;
    } else if (auto it = state.buffers.find(n); it != state.buffers.end()) {
      in = std::move(it->second);
      state.buffers.erase(it);
    }
    in.resize(n->num_inputs());
    if (auto* acc = dynamic_cast<accumulate_grad*>(n)) {
      try {
        capture_leaf(ctx, *acc, std::move(in));
      } catch (const std::exception& e) {
        throw error(errc::autograd_error, std::string("dist_autograd: a hook of a leaf threw: ") + e.what());
      }
      continue;
    }
    tensor_list out;
    {
      run_binding bound(*n, info);  // a recv function starts its propagation as part of this run
      out = engine_steps::run_node(*n, std::move(in));
    }
    if (!retain) n->release_variables();
    engine_steps::deliver(*n, std::move(out), state.buffers, state.deps, ready);
    for (grad_node* r : ready) queue.push(r);
    ready.clear();
  }
}

}  // namespace troupe::dist_autograd
