// RPC device maps (Note [rpc device map] in troupe/actors/rpc/device_map.hpp).
#include "troupe/actors/rpc/device_map.hpp"


#include "device_scope.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::rpc {

void validate_device_map(const std::string& peer, const device_map& map) {
  std::map<int, int> target_of;  // peer index -> local index that claimed it
  for (const auto& [local, remote] : map) {
    const std::string entry = "cuda:" + std::to_string(local) + " -> cuda:" + std::to_string(remote);
    if (local < 0 || remote < 0)
      throw error(errc::bad_argument, "device map for worker '" + peer + "': entry " + entry + " has a negative device index");
    const auto [it, fresh] = target_of.emplace(remote, local);
    if (!fresh)
      throw error(errc::bad_argument, "device map for worker '" + peer + "': cuda:" + std::to_string(it->second) +
                                          " and cuda:" + std::to_string(local) + " both map to cuda:" + std::to_string(remote) +
                                          " (a device map must be one-to-one)");
  }
}

device_map invert_device_map(const std::string& peer, const device_map& map) {
  validate_device_map(peer, map);
  device_map inverse;
  for (const auto& [local, remote] : map) inverse.emplace(remote, local);
  return inverse;
}

troupe::device result_device(const std::string& peer, const device_map& reverse, int remote) {
  if (const auto e = reverse.find(remote); e != reverse.end()) return cuda_device(e->second);
  throw error(errc::device_mismatch, "a CUDA tensor on cuda:" + std::to_string(remote) + " of worker '" + peer +
                                         "' cannot come back to this worker: the device map for '" + peer +
                                         "' maps no local device to cuda:" + std::to_string(remote) +
                                         " (results come back by the reverse map), or move it to the CPU first");
}

void device_maps::count(bool ipc) const { (ipc ? ipc_ : staged_).fetch_add(1, std::memory_order_relaxed); }

device_transfers device_maps::transfers() const {
  return {ipc_.load(std::memory_order_relaxed), staged_.load(std::memory_order_relaxed)};
}

void device_maps::set(const std::string& peer, device_map map) {
  validate_device_map(peer, map);
  std::lock_guard<std::mutex> lock(mu_);
  maps_[peer] = std::move(map);
  any_.store(true, std::memory_order_release);
}

troupe::device device_maps::target(const std::string& peer, troupe::device local) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto m = maps_.find(peer);
  if (m != maps_.end())
    if (const auto e = m->second.find(local.index); local.is_cuda() && e != m->second.end()) return cuda_device(e->second);
  throw error(errc::device_mismatch, "a tensor on " + troupe::to_string(local) + " cannot be sent to worker '" + peer +
                                         "': its device map has no entry for " + troupe::to_string(local) +
                                         " (node::set_device_map or node_options::device_maps), or move it to the CPU first");
}

device_map device_maps::of(const std::string& peer) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto m = maps_.find(peer);
  return m == maps_.end() ? device_map{} : m->second;
}

namespace detail {
device_scope::device_scope(const device_maps& maps, std::string peer, bool ipc) : maps_(&maps), peer_(std::move(peer)), ipc_(ipc) {}
}  // namespace detail

}  // namespace troupe::rpc
