#pragma once
// How a call's CUDA tensors are written (Note [rpc device map]); a codec_context points to it.

#include <memory>
#include <string>
#include <vector>

#include "troupe/actors/rpc/device_map.hpp"

namespace troupe::rpc::detail {

/// When a codec context points to it, write_tensor sends CUDA tensors by its rules. Without one
/// CUDA tensors are staged as CPU tensors (kind 0).
class device_scope {
 public:
  /// A call to `peer`: CUDA tensors go to the devices `maps` gives (kind 3, staged). They go by
  /// IPC handle (kind 5) when `ipc` (same host, another process) and CUDA allows it.
  device_scope(const device_maps& maps, std::string peer, bool ipc);
  /// A served call's answer: CUDA tensors go staged with their own device index (kind 4). The
  /// caller puts them on its device by the reverse of its map.
  device_scope() = default;
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;

  /// Whether this scope encodes an answer (kind 4) rather than a call.
  bool answering() const { return maps_ == nullptr; }
  /// Whether CUDA tensors may go by IPC handle.
  bool ipc() const { return ipc_; }
  /// maps.target(peer, local): throws device_mismatch naming the device and the peer.
  troupe::device target(troupe::device local) const { return maps_->target(peer_, local); }
  /// Counts one transfer on the node's device maps (a call scope only).
  void count(bool by_ipc) const {
    if (maps_) maps_->count(by_ipc);
  }
  /// What must live until the call's response (IPC sources); filled while encoding.
  std::vector<std::shared_ptr<const void>>& kept() const { return kept_; }

 private:
  const device_maps* maps_ = nullptr;
  std::string peer_;
  bool ipc_ = false;
  mutable std::vector<std::shared_ptr<const void>> kept_;
};

}  // namespace troupe::rpc::detail
