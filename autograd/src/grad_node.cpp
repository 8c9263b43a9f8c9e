// Node basics: sequence numbers, hooks around apply, the graph root.
#include "troupe/autograd/grad_node.hpp"

#include <algorithm>

namespace troupe {

namespace {
// Per-thread, like PyTorch's: it orders nodes created by one thread (later = higher), which is
// all the ready queue needs; correctness never depends on it (dependencies do).
thread_local std::uint64_t next_sequence_nr = 0;

template <class Vec>
void erase_id(Vec& v, std::uint64_t id) {
  v.erase(std::remove_if(v.begin(), v.end(), [id](const auto& h) { return h.id == id; }), v.end());
}
}  // namespace

grad_node::grad_node(std::string name, edge_list next_edges, std::uint32_t num_inputs)
    : grad_node(std::move(name), std::move(next_edges), num_inputs, next_sequence_nr++) {}

grad_node::grad_node(std::string name, edge_list next_edges, std::uint32_t num_inputs, std::uint64_t sequence_nr)
    : name_(std::move(name)), next_edges_(std::move(next_edges)), num_inputs_(num_inputs), sequence_nr_(sequence_nr) {}

grad_node::~grad_node() {
  // Take over the next nodes we hold the last reference to, and their next nodes, and so on:
  // each is destroyed with empty edges, so destruction never recurses.
  std::vector<std::shared_ptr<grad_node>> stack;
  auto take = [&stack](edge_list& edges) {
    for (auto& e : edges)
      if (e.fn && e.fn.use_count() == 1) stack.push_back(std::move(e.fn));
    edges.clear();
  };
  take(next_edges_);
  while (!stack.empty()) {
    std::shared_ptr<grad_node> n = std::move(stack.back());
    stack.pop_back();
    take(n->next_edges_);
  }
}

void grad_node::apply_tensor_hooks(tensor_list& grads) {
  std::vector<tensor_pre_hook> hooks;
  std::vector<std::pair<std::uint32_t, std::function<void(const tensor&)>>> retains;
  {
    std::lock_guard<std::mutex> lk(hooks_mutex_);
    hooks = tensor_pre_hooks_;
    retains = retains_grad_hooks_;
  }
  for (const auto& h : hooks) {
    if (h.input_nr >= grads.size() || !grads[h.input_nr].defined()) continue;
    tensor r = h.fn(grads[h.input_nr]);
    if (r.defined()) grads[h.input_nr] = std::move(r);
  }
  for (const auto& [nr, fn] : retains)
    if (nr < grads.size() && grads[nr].defined()) fn(grads[nr]);
}

tensor_list grad_node::run(tensor_list&& grads) {
  apply_tensor_hooks(grads);
  std::vector<keyed<node_pre_hook>> pre;
  std::vector<keyed<node_post_hook>> post;
  {
    std::lock_guard<std::mutex> lk(hooks_mutex_);
    pre = pre_hooks_;
    post = post_hooks_;
  }
  for (const auto& h : pre) h.fn(grads);
  if (post.empty()) return apply(std::move(grads));
  tensor_list grad_outputs = grads;
  tensor_list grad_inputs = apply(std::move(grads));
  for (const auto& h : post) h.fn(grad_inputs, grad_outputs);
  return grad_inputs;
}

hook_handle grad_node::register_pre_hook(node_pre_hook fn) {
  std::lock_guard<std::mutex> lk(hooks_mutex_);
  const auto id = next_hook_id_++;
  pre_hooks_.push_back({id, std::move(fn)});
  return hook_handle([w = weak_from_this(), id] {
    if (auto n = w.lock()) {
      std::lock_guard<std::mutex> l(n->hooks_mutex_);
      erase_id(n->pre_hooks_, id);
    }
  });
}

hook_handle grad_node::register_post_hook(node_post_hook fn) {
  std::lock_guard<std::mutex> lk(hooks_mutex_);
  const auto id = next_hook_id_++;
  post_hooks_.push_back({id, std::move(fn)});
  return hook_handle([w = weak_from_this(), id] {
    if (auto n = w.lock()) {
      std::lock_guard<std::mutex> l(n->hooks_mutex_);
      erase_id(n->post_hooks_, id);
    }
  });
}

hook_handle grad_node::register_tensor_pre_hook(std::uint32_t input_nr, tensor_hook fn) {
  std::lock_guard<std::mutex> lk(hooks_mutex_);
  const auto id = next_hook_id_++;
  tensor_pre_hooks_.push_back({id, input_nr, std::move(fn)});
  return hook_handle([w = weak_from_this(), id] {
    if (auto n = w.lock()) {
      std::lock_guard<std::mutex> l(n->hooks_mutex_);
      erase_id(n->tensor_pre_hooks_, id);
    }
  });
}

void grad_node::set_retains_grad_hook(std::uint32_t input_nr, std::function<void(const tensor&)> fn) {
  std::lock_guard<std::mutex> lk(hooks_mutex_);
  for (auto& [nr, f] : retains_grad_hooks_) {
    if (nr == input_nr) {
      f = std::move(fn);
      return;
    }
  }
  retains_grad_hooks_.emplace_back(input_nr, std::move(fn));
}

// ---- graph_root ---------------------------------------------------------------------------

graph_root::graph_root(edge_list roots, tensor_list grads)
    : grad_node("graph_root", std::move(roots), 0), grads_(std::move(grads)) {}

tensor_list graph_root::apply(tensor_list&&) { return grads_; }

}  // namespace troupe
