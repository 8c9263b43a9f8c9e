#pragma once
// CUDA tensors between processes of one host by IPC handles (Note [rpc device map] in
// troupe/actors/rpc/device_map.hpp).

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/actors/rpc/codec.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe::detail {

/// A peer's device allocation opened in this process (cudaIpcOpenMemHandle); closed when the
/// last holder lets go. Only built with TROUPE_WITH_CUDA.
class ipc_mapping;

/// The allocations of peers this node opened, per peer and device, so that one allocation is
/// opened once per device (CUDA allows no second open). Thread-safe. RAII: drop(), clear() and
/// the destructor close what no copy still uses.
class cuda_ipc_cache {
 public:
  cuda_ipc_cache() = default;
  ~cuda_ipc_cache();
  cuda_ipc_cache(const cuda_ipc_cache&) = delete;
  cuda_ipc_cache& operator=(const cuda_ipc_cache&) = delete;

  /// The mapping of `handle` (64 bytes) from `peer` on local `device`, opened on first use.
  /// Throws cuda_failure naming the call when CUDA refuses it.
  std::shared_ptr<ipc_mapping> open(const std::string& peer, int device, const std::string& handle);
  /// `peer` is gone: its mappings close (once no copy uses them).
  void drop(const std::string& peer);
  /// Closes every mapping (node teardown).
  void clear();

 private:
  std::mutex mu_;
  std::map<std::string, std::map<std::string, std::shared_ptr<ipc_mapping>>> open_;  // peer -> device+handle
};

}  // namespace troupe::detail

namespace troupe::rpc::detail {

/// dtype, rank, sizes and byte count of a contiguous tensor (codec.cpp).
void write_tensor_header(writer& w, const tensor& h);
/// Throws device_mismatch naming `index` when this process sees no CUDA device of that index
/// (codec.cpp; `sizes` names the tensor).
void check_device_present(const shape_t& sizes, std::int32_t index);

/// Writes a private copy of `t` (a CUDA tensor) as kind 5 for device `to` of the peer. It writes
/// an IPC handle of the copy's allocation, the offset, and an IPC event recorded on the current
/// stream of its device. On success it appends to `keep` what must live until the call's
/// response (the tensor and the event), and returns true. On any failure it writes nothing and
/// returns false (the caller stages).
bool write_tensor_ipc(writer& w, const tensor& t, std::int32_t to, std::vector<std::shared_ptr<const void>>& keep);

/// Reads the IPC part of a kind-5 tensor of `sizes`/`dt`/`nbytes` for local device `to`. It
/// waits for the sender's event on the current stream of `to`, copies into a new tensor on `to`
/// and synchronises. `cache` (may be null: opened and closed here) holds the mappings of `peer`.
/// device_mismatch when this process lacks `to`; cuda_failure naming the call when CUDA fails.
tensor read_tensor_ipc(reader& r, const shape_t& sizes, troupe::dtype dt, std::uint64_t nbytes, std::int32_t to,
                       troupe::detail::cuda_ipc_cache* cache, const std::string& peer);

}  // namespace troupe::rpc::detail
