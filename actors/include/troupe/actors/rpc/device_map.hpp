#pragma once
/// \file device_map.hpp
/// Device maps of RPC, as torch's TensorPipeRpcBackendOptions.set_device_map. For each peer, a
/// map says which CUDA device of the peer receives a tensor that lives on a CUDA device of this
/// worker.
///
/// Note [rpc device map]
/// ---------------------
/// A map belongs to the caller and names one peer: {local CUDA index -> peer CUDA index}.
///
///   caller: arg on cuda:1 --map[peer]{1 -> 0}--> same host, other process: private copy + IPC
///           handle + IPC event (kind 5); else staged to host --wire (kind 3, "cuda:0")-->
///   callee: IPC: current stream waits for the event, copies d2d; staged: bytes -> cuda:0;
///           on the decoding thread's current stream -> synchronised -> fn(arg)
///   callee: result on cuda:0 --staged (kind 4, "cuda:0")--> caller: reverse map {0 -> 1} -> cuda:1
///
/// - Set time: node_options::device_maps and node::set_device_map validate at once. A negative
///   index, two local devices mapped to one peer device, or a non-worker peer is bad_argument.
///   The error names the peer and the entry.
/// - Call time: a CUDA argument whose device has no entry in the callee's map fails the call.
///   The error is device_mismatch naming the device and the peer. The future carries it; nothing
///   is sent. A CPU argument is unaffected by the map.
/// - Transfer, same host and another process: the caller clones the tensor on its current
///   stream and records an interprocess event after the clone. It sends cudaIpcGetMemHandle of
///   the clone's allocation, the offset and the event's handle (kind 5). The caching allocator
///   gives whole cudaMalloc blocks, so a plain storage's data is the base. The call state holds
///   the clone and the event until the call completes. The receiver opens the handle in the
///   node's cuda_ipc_cache, once per peer allocation and device, since CUDA refuses a second
///   open. The cache drops it with the peer and closes it at teardown. The receiver makes its
///   current stream wait on the event and copies device to device into its own tensor. A
///   receiver-side failure fails the call.
/// - Transfer otherwise (another host, the same process, a caller-side IPC call that fails):
///   the tensor is staged through host memory. That is one device-to-host copy on the caller's
///   current stream, which the encoder waits for. It is sent as bytes (kind 3) and copied to the
///   mapped device on the receiver. node::device_transfers() counts both ways. A receiver
///   without the mapped device fails the call with device_mismatch naming it.
/// - Stream rule: the receiver's tensor is ready on every stream when the function runs, for
///   kinds 3, 4 and 5. The decoder synchronises its copy on its current stream of the device.
///   The caller may reuse or free its tensor once the call returned its future. The staging
///   copy or the private IPC copy exists by then.
/// - Results and RRef values fetched by a call: a CUDA tensor goes staged with the callee's
///   device (kind 4). It lands on the caller's device given by the reverse of the caller's map
///   for that callee (invert_device_map). No reverse entry, or no call to place it by, is
///   device_mismatch naming the device and the peer.

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "troupe/tensors/device.hpp"

namespace troupe::rpc {

/// Local CUDA device index -> the peer's CUDA device index.
using device_map = std::map<int, int>;

/// Throws bad_argument naming `peer` and the entry: a negative index on either side, or two
/// local devices mapped to the same peer device. Never blocks.
void validate_device_map(const std::string& peer, const device_map& map);

/// The inverse of `map` (peer index -> local index), after validate_device_map (throws as it
/// does, naming `peer`). Results of a call come back through it.
device_map invert_device_map(const std::string& peer, const device_map& map);

/// The local device for the peer's CUDA device `remote`, by `reverse` (invert_device_map of the
/// map for `peer`). Throws device_mismatch naming the device and `peer` when there is no entry.
troupe::device result_device(const std::string& peer, const device_map& reverse, int remote);

/// How a node's CUDA arguments went to their peers (Note [rpc device map]).
struct device_transfers {
  std::uint64_t ipc = 0;     ///< by CUDA IPC handle (same host, another process)
  std::uint64_t staged = 0;  ///< staged through host memory and sent as bytes
};

/// The device maps of one node, per peer (Note [rpc device map]). Thread-safe.
class device_maps {
 public:
  /// Replaces the map of `peer` after validate_device_map (throws as it does; the old map stays).
  void set(const std::string& peer, device_map map);
  /// The device on `peer` that a tensor on `local` (a CUDA device) goes to. Throws
  /// device_mismatch naming the device and the peer when the map of `peer` has no entry for it.
  troupe::device target(const std::string& peer, troupe::device local) const;
  /// The map of `peer` (empty when none was set).
  device_map of(const std::string& peer) const;
  /// Whether no map was ever set (a lock-free test for the paths that need none).
  bool empty() const { return !any_.load(std::memory_order_acquire); }
  /// Counts one CUDA argument sent by IPC handle (`ipc`) or staged.
  void count(bool ipc) const;
  /// The transfers counted so far.
  device_transfers transfers() const;

 private:
  mutable std::atomic<std::uint64_t> ipc_{0}, staged_{0};
  std::atomic<bool> any_{false};
  mutable std::mutex mu_;
  std::map<std::string, device_map> maps_;
};

}  // namespace troupe::rpc
