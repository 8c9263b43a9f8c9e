// The per-node steps shared by the backward engines (troupe/autograd/engine_steps.hpp).
#include "troupe/autograd/engine_steps.hpp"

#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/error.hpp"

#if defined(TROUPE_WITH_CUDA)
#include <optional>

#include "troupe/tensors/cuda.hpp"
#endif

namespace troupe::engine_steps {

namespace {

void accumulate(tensor& slot, tensor g) {
  if (!g.defined()) return;
  slot = slot.defined() ? add(slot, g) : std::move(g);
}

#if defined(TROUPE_WITH_CUDA)
// Note [Backward streams]: a CUDA gradient made by `producer` is consumed on `consumer`'s stream.
// A node runs on its forward stream. Nodes without one, such as AccumulateGrad, run on the engine
// thread's current stream. When the two streams differ, the consumer's stream waits on an event
// recorded on the producer's, and the accumulation into the input buffer runs on the consumer's.
void order_streams(const grad_node& producer, const grad_node& consumer, const tensor& g,
                   std::optional<cuda::stream_guard>& guard) {
  if (!g.defined() || !g.is_cuda()) return;
  const int dev = g.device().index;
  auto stream_of = [dev](const grad_node& x) {
    return x.forward_device() == dev ? x.forward_stream() : cuda::current_stream(dev);
  };
  cuda::stream_handle from = stream_of(producer), to = stream_of(consumer);
  if (from != to) {
    cuda::event ready(dev);
    ready.record(from);
    ready.wait(to);
  }
  guard.emplace(dev, to);
}
#endif

}  // namespace

tensor_list run_node(grad_node& n, tensor_list&& grads) {
  std::lock_guard<std::mutex> lk(n.run_mutex());
#if defined(TROUPE_WITH_CUDA)
  // Note [Backward streams]: run on the stream the forward op used.
  std::optional<cuda::stream_guard> on_stream;
  if (n.forward_device() >= 0) on_stream.emplace(n.forward_device(), n.forward_stream());
#endif
  try {
    return n.run(std::move(grads));
  } catch (const error& e) {
    throw error(e.code(), "backward of " + n.name() + ": " + e.message());
  } catch (const std::exception& e) {
    throw error(errc::autograd_error, "backward of " + n.name() + " threw: " + e.what());
  }
}

void deliver(grad_node& n, tensor_list&& out, input_buffers& buffers, dependency_counts& deps, std::vector<grad_node*>& ready) {
  const auto& edges = n.next_edges();
  if (out.size() != edges.size())
    throw error(errc::autograd_error, "backward of " + n.name() + " returned " + std::to_string(out.size()) +
                                          " gradients for " + std::to_string(edges.size()) + " next edges");
  for (std::size_t i = 0; i < edges.size(); ++i) {
    const edge& e = edges[i];
    if (!e.valid()) continue;
    auto& buf = buffers[e.fn.get()];
    if (buf.empty()) buf.resize(e.fn->num_inputs());
    if (e.input_nr >= buf.size())
      throw error(errc::autograd_error, "edge from " + n.name() + " into input " + std::to_string(e.input_nr) +
                                            " of " + e.fn->name() + ", which takes " + std::to_string(buf.size()));
#if defined(TROUPE_WITH_CUDA)
    std::optional<cuda::stream_guard> on_consumer_stream;
    order_streams(n, *e.fn, out[i], on_consumer_stream);
#endif
    accumulate(buf[e.input_nr], std::move(out[i]));
    if (--deps[e.fn.get()] == 0) ready.push_back(e.fn.get());
  }
}

}  // namespace troupe::engine_steps
