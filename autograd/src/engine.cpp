// The local backward engine (Note [Local backward] in troupe/autograd/engine.hpp).
#include "troupe/autograd/engine.hpp"

#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "troupe/autograd/autograd_meta.hpp"
#include "troupe/autograd/engine_steps.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe {

namespace {

// Everything one pass needs; lives on the caller's stack (no state shared between passes).
struct pass_state {
  const graph_task& task;
  std::unordered_map<grad_node*, int> deps;
  std::unordered_map<grad_node*, tensor_list> buffers;
  std::unordered_map<grad_node*, std::vector<std::uint32_t>> captured;  // node -> captured input_nrs
  std::unordered_set<grad_node*> skip;  // reachable nodes that must not run
};

bool is_accumulator(const grad_node* n) { return dynamic_cast<const accumulate_grad*>(n) != nullptr; }

// Counts, for every node reachable from `root`, the edges pointing at it (iteratively: graphs
// may be deep chains). Returns the reachable nodes in discovery order.
std::vector<grad_node*> count_dependencies(grad_node* root, pass_state& s) {
  std::vector<grad_node*> stack{root}, seen_order{root};
  std::unordered_set<grad_node*> seen{root};
  while (!stack.empty()) {
    grad_node* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next_edges()) {
      if (!e.valid()) continue;
      ++s.deps[e.fn.get()];
      if (seen.insert(e.fn.get()).second) {
        stack.push_back(e.fn.get());
        seen_order.push_back(e.fn.get());
      }
    }
  }
  return seen_order;
}

// Nodes in an order where every node comes before the nodes its edges point at (Kahn).
std::vector<grad_node*> topological_order(grad_node* root, const pass_state& s) {
  auto deps = s.deps;
  std::vector<grad_node*> order{root};
  for (std::size_t i = 0; i < order.size(); ++i)
    for (const auto& e : order[i]->next_edges())
      if (e.valid() && --deps[e.fn.get()] == 0) order.push_back(e.fn.get());
  return order;
}

// Marks which nodes must not run: captured leaves always; when edges are captured, every node
// without a path to a captured edge (it would only touch .grad or unrelated nodes).
void plan_execution(grad_node* root, const std::vector<grad_node*>& reachable, pass_state& s) {
  const auto& task = s.task;
  for (const auto& e : task.captured)
    if (e.valid()) s.captured[e.fn.get()].push_back(e.input_nr);
  if (task.capture_leaves)
    for (grad_node* n : reachable)
      if (is_accumulator(n)) {
        s.captured[n].push_back(0);
        s.skip.insert(n);
      }
  if (task.captured.empty()) return;
  const auto order = topological_order(root, s);
  std::unordered_set<grad_node*> reaches;  // node is captured or leads to a captured node
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    grad_node* n = *it;
    bool child_reaches = false;
    for (const auto& e : n->next_edges()) child_reaches = child_reaches || (e.valid() && reaches.count(e.fn.get()));
    if (child_reaches || s.captured.count(n)) reaches.insert(n);
    if (!child_reaches) s.skip.insert(n);
  }
}

}  // namespace

void engine::execute(const graph_task& task) const {
  no_grad_guard ng;
  edge_list root_edges;
  tensor_list root_grads;
  for (const auto& [e, g] : task.roots) {
    root_edges.push_back(e);
    root_grads.push_back(g);
  }
  auto root = std::make_shared<graph_root>(std::move(root_edges), std::move(root_grads));
  pass_state s{task, {}, {}, {}, {}};
  plan_execution(root.get(), count_dependencies(root.get(), s), s);
  std::priority_queue<grad_node*, std::vector<grad_node*>, engine_steps::later_first> queue;
  queue.push(root.get());
  std::vector<grad_node*> ready;
  while (!queue.empty()) {
    grad_node* n = queue.top();
    queue.pop();
    tensor_list in;
    if (auto it = s.buffers.find(n); it != s.buffers.end()) {
      in = std::move(it->second);
      s.buffers.erase(it);
    }
    in.resize(n->num_inputs());
    if (auto c = s.captured.find(n); c != s.captured.end() && task.capture)
      for (auto nr : c->second) task.capture(edge{n->shared_from_this(), nr}, in[nr]);
    if (s.skip.count(n)) continue;
    tensor_list out = engine_steps::run_node(*n, std::move(in));
    if (!task.retain_graph) n->release_variables();
    engine_steps::deliver(*n, std::move(out), s.buffers, s.deps, ready);
    for (grad_node* r : ready) queue.push(r);
    ready.clear();
  }
}

namespace {

std::vector<std::pair<edge, tensor>> make_roots(const tensor_list& roots, const tensor_list& grads, const char* fn) {
  if (!grads.empty() && grads.size() != roots.size())
    throw error(errc::bad_argument, std::string(fn) + ": " + std::to_string(grads.size()) + " gradients for " +
                                        std::to_string(roots.size()) + " roots");
  std::vector<std::pair<edge, tensor>> out;
  for (std::size_t i = 0; i < roots.size(); ++i) {
    const tensor& r = roots[i];
    const std::string which = std::string(fn) + ": root " + std::to_string(i);
    if (!r.defined()) throw error(errc::invalid_state, which + " is undefined");
    if (!r.requires_grad())
      throw error(errc::autograd_error, which + " (shape " + shape_to_string(r.shape()) +
                                            ") does not require grad and has no grad_fn");
    tensor g = grads.empty() ? tensor() : grads[i];
    if (!g.defined()) {
      if (r.numel() != 1)
        throw error(errc::autograd_error, which + " has shape " + shape_to_string(r.shape()) +
                                              ": a gradient can be implied only for a one-element root; pass grad_root");
      g = ones_like(r);
    } else if (g.shape() != r.shape()) {
      throw error(errc::shape_mismatch, which + " has shape " + shape_to_string(r.shape()) + " but its gradient has shape " +
                                            shape_to_string(g.shape()));
    } else if (g.device() != r.device()) {
      throw error(errc::device_mismatch, which + " is on " + to_string(r.device()) + " but its gradient is on " +
                                             to_string(g.device()));
    } else if (g.dtype() != r.dtype()) {
      no_grad_guard ng;
      g = g.to(r.dtype());
    }
    out.emplace_back(gradient_edge(r), std::move(g));
  }
  return out;
}

}  // namespace

void engine::backward(const tensor_list& roots, const tensor_list& grad_roots, bool retain_graph) const {
  graph_task task;
  task.roots = make_roots(roots, grad_roots, "backward");
  task.retain_graph = retain_graph;
  execute(task);
}

tensor_list engine::grad(const tensor_list& outputs, const tensor_list& inputs, const tensor_list& grad_outputs,
                         bool retain_graph) const {
  graph_task task;
  task.roots = make_roots(outputs, grad_outputs, "grad");
  task.retain_graph = retain_graph;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined() || !inputs[i].requires_grad())
      throw error(errc::autograd_error, "grad: input " + std::to_string(i) + " does not require grad");
    task.captured.push_back(gradient_edge(inputs[i]));
  }
  tensor_list result(inputs.size());
  task.capture = [&](const edge& e, const tensor& g) {
    for (std::size_t k = 0; k < task.captured.size(); ++k)
      if (task.captured[k] == e) result[k] = g;
  };
  execute(task);
  return result;
}

}  // namespace troupe
