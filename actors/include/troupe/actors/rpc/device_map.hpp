#pragma once
/// \file device_map.hpp
/// Device maps of RPC, as torch's TensorPipeRpcBackendOptions.set_device_map: for each peer,
/// which CUDA device of the peer receives a tensor that lives on a CUDA device of this worker.
///
/// Note [rpc device map]
/// ---------------------
/// A map belongs to the caller and names one peer: {local CUDA index -> peer CUDA index}.
///
///   caller: arg on cuda:1 --map[peer]{1 -> 0}--> staged to host --wire (kind 3, "cuda:0")-->
///   callee: bytes -> cuda:0 on the decoding thread's current stream -> synchronised -> fn(arg)
///
/// - Set time: node_options::device_maps and node::set_device_map validate at once: a negative
///   index, two local devices mapped to one peer device, or a peer that is not a worker of the
///   job is bad_argument naming the peer and the entry.
/// - Call time: a CUDA argument whose device has no entry in the map of the callee fails the
///   call with device_mismatch naming the device and the peer (the future carries it; nothing
///   is sent). A CPU argument is unaffected by the map.
/// - Transfer: the tensor is staged through host memory (one device-to-host copy on the
///   caller's current stream, which the encoder waits for), sent as bytes, and copied to the
///   mapped device on the receiver. A receiver without that device fails the call with
///   device_mismatch naming it.
/// - Stream rule: the receiver's tensor is ready on every stream when the function runs (the
///   decoder synchronises its copy). The caller may reuse or free its tensor once the call
///   returned its future (the staging copy is complete by then).
/// - Results and RRef values travel back to the caller staged as CPU tensors (no reverse map).

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

/// Throws device_mismatch naming the device and `peer` when `reverse` (invert_device_map of the
/// map for `peer`) has no entry for the peer's CUDA device `remote`; else the local device.
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
  /// Counts one CUDA argument sent by IPC handle (`ipc`) or staged.
  void count(bool ipc) const;
  /// The transfers counted so far.
  device_transfers transfers() const;

 private:
  mutable std::atomic<std::uint64_t> ipc_{0}, staged_{0};
  mutable std::mutex mu_;
  std::map<std::string, device_map> maps_;
};

}  // namespace troupe::rpc
