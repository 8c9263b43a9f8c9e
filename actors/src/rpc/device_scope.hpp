#pragma once
// The device map of the call being encoded on this thread (Note [rpc device map]).

#include <string>

#include "troupe/actors/rpc/device_map.hpp"

namespace troupe::rpc::detail {

/// Makes write_tensor send CUDA tensors to the devices `maps` gives for `peer` while alive
/// (nested scopes restore the outer one). Outside a scope CUDA tensors are staged as CPU tensors.
class device_scope {
 public:
  device_scope(const device_maps& maps, std::string peer);
  ~device_scope();
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;

  /// The scope active on this thread; null outside one.
  static const device_scope* active();
  /// maps.target(peer, local): throws device_mismatch naming the device and the peer.
  troupe::device target(troupe::device local) const { return maps_.target(peer_, local); }

 private:
  const device_maps& maps_;
  std::string peer_;
  const device_scope* outer_;
};

}  // namespace troupe::rpc::detail
