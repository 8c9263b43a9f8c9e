#pragma once
/// \file functions.hpp
/// The graph nodes that stitch local autograd graphs across an RPC (Note [send and recv]).
///
/// Note [send and recv]
/// Tensors that require grad may travel in an RPC inside a context. Then the sender records a
/// send_function whose next edges are the sent tensors' gradient edges. The receiver records a
/// recv_function that becomes the grad_fn of the received tensors. Both are stored in their
/// worker's context under the same (context id, message id). In backward, the receiver's
/// recv_function hands the gradients of the received tensors to a callback. The callback sends
/// them to the sender (PropagateGradients). The sender then runs the matching send_function's
/// subgraph with those gradients as roots.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "troupe/autograd/grad_node.hpp"

namespace troupe::dist_autograd {

/// A globally unique context id: (worker id << 48) | per-worker counter.
using context_id = std::uint64_t;
/// A globally unique autograd message id, same layout as context_id.
using message_id = std::uint64_t;

/// The sender's end of an RPC: gradients that arrive for the sent tensors enter the local graph
/// here (apply passes them through to the sent tensors' edges).
///
/// Note [Gradients keep their device]
/// A gradient that comes back over RPC may arrive on another device than the tensor that was
/// sent. RPC stages CUDA tensors through the host where no device map covers the way back.
/// send_function remembers each sent tensor's device and moves an arriving gradient there, so
/// the local backward sees it where the forward ran. The copy to a CUDA device runs on the
/// backward thread's current stream of that device (Note [Current stream]). That is the stream
/// the engine runs the send_function's node on, so the nodes after it see the gradient in order.
class send_function final : public grad_node {
 public:
  /// `edges[i]` is the gradient edge of the i-th sent tensor (invalid if it needs no grad);
  /// `devices[i]` its device (empty: every gradient is passed through as it arrives).
  explicit send_function(edge_list edges, std::vector<troupe::device> devices = {});
  /// The gradients, each moved to its sent tensor's device (Note [Gradients keep their device]).
  tensor_list apply(tensor_list&& grads) override;
  /// The devices of the sent tensors, in order.
  const std::vector<troupe::device>& devices() const noexcept { return devices_; }

 private:
  std::vector<troupe::device> devices_;
};

/// The receiver's end: the grad_fn of the received tensors. Its backward hands the gradients to
/// `propagate` (which sends them to `from`) and returns no local gradients.
/// The distributed engine's run that executes a recv function (defined by the engine).
struct run_info;

class recv_function final : public grad_node {
 public:
  /// Sends the gradients of the received tensors back to their sender, as part of `run` (null
  /// when the node runs outside a distributed backward).
  using propagate_fn = std::function<void(const tensor_list& grads, const run_info* run)>;
  recv_function(std::uint32_t num_tensors, std::string from, propagate_fn propagate);
  tensor_list apply(tensor_list&& grads) override;
  /// The worker the tensors came from.
  const std::string& from() const noexcept { return from_; }
  /// Makes `run` the run that apply() reports to the callback (the engine sets it while it runs
  /// this node and clears it after; the context's run lock orders the runs).
  void bind_run(const run_info* run) noexcept { run_ = run; }

 private:
  std::string from_;
  propagate_fn propagate_;
  const run_info* run_ = nullptr;
};

}  // namespace troupe::dist_autograd
