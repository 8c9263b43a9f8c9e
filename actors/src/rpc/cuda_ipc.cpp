// CUDA tensors by IPC handle between processes of one host (Note [rpc device map] in
// troupe/actors/rpc/device_map.hpp).
#include "rpc/cuda_ipc.hpp"

#include <cstring>

#include "troupe/tensors/cuda.hpp"
#include "troupe/tensors/error.hpp"
#include "troupe/tensors/factories.hpp"

#if defined(TROUPE_WITH_CUDA)
#include <cuda_runtime.h>
#endif

namespace troupe::detail {

#if defined(TROUPE_WITH_CUDA)
namespace {

void check(cudaError_t err, const char* call) {
  if (err != cudaSuccess) {
    static_cast<void>(cudaGetLastError());  // clears a sticky-free error so later calls are not blamed
    throw error(errc::cuda_failure, std::string("rpc CUDA IPC: ") + call + " failed: " + cudaGetErrorString(err));
  }
}

/// Makes `device` current for its lifetime and restores the previous one.
class device_guard {
 public:
  explicit device_guard(int device) {
    check(cudaGetDevice(&prev_), "cudaGetDevice");
    if (prev_ != device) check(cudaSetDevice(device), "cudaSetDevice");
  }
  ~device_guard() { static_cast<void>(cudaSetDevice(prev_)); }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;

 private:
  int prev_ = 0;
};

}  // namespace

class ipc_mapping {
 public:
  ipc_mapping(int device, const std::string& handle) : device_(device) {
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof h);
    device_guard on(device);
    check(cudaIpcOpenMemHandle(&base_, h, cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle");
  }
  ~ipc_mapping() {
    try {
      device_guard on(device_);
      static_cast<void>(cudaIpcCloseMemHandle(base_));
    } catch (...) {
      // Closing is best effort: the driver releases the mapping when the process exits.
    }
  }
  ipc_mapping(const ipc_mapping&) = delete;
  ipc_mapping& operator=(const ipc_mapping&) = delete;
  const char* base() const { return static_cast<const char*>(base_); }

 private:
  int device_;
  void* base_ = nullptr;
};
#else
class ipc_mapping {};
#endif

cuda_ipc_cache::~cuda_ipc_cache() { clear(); }

std::shared_ptr<ipc_mapping> cuda_ipc_cache::open(const std::string& peer, int device, const std::string& handle) {
#if defined(TROUPE_WITH_CUDA)
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = open_[peer][std::to_string(device) + ":" + handle];
  if (!slot) slot = std::make_shared<ipc_mapping>(device, handle);
  return slot;
#else
  static_cast<void>(peer), static_cast<void>(device), static_cast<void>(handle);
  throw error(errc::device_mismatch, "rpc CUDA IPC: this build has no CUDA backend");
#endif
}

void cuda_ipc_cache::drop(const std::string& peer) {
  std::map<std::string, std::shared_ptr<ipc_mapping>> gone;  // closed after the lock
  std::lock_guard<std::mutex> lock(mu_);
  if (const auto it = open_.find(peer); it != open_.end()) {
    gone.swap(it->second);
    open_.erase(it);
  }
}

void cuda_ipc_cache::clear() {
  std::map<std::string, std::map<std::string, std::shared_ptr<ipc_mapping>>> gone;
  std::lock_guard<std::mutex> lock(mu_);
  gone.swap(open_);
}

}  // namespace troupe::detail

namespace troupe::rpc::detail {

namespace {
constexpr std::size_t handle_bytes = 64;  // sizeof(cudaIpcMemHandle_t) == sizeof(cudaIpcEventHandle_t)

// An IPC tensor's range: `nbytes` at `offset` must lie inside the sender's allocation of `extent`.
void check_ipc_range(std::uint64_t nbytes, std::uint64_t offset, std::uint64_t extent) {
  if (offset > extent || nbytes > extent - offset)
    throw error(errc::protocol_violation, "rpc CUDA IPC tensor: " + std::to_string(nbytes) + " bytes at offset " + std::to_string(offset) +
                                              " exceed its allocation of " + std::to_string(extent));
}
}  // namespace

#if defined(TROUPE_WITH_CUDA)
static_assert(sizeof(cudaIpcMemHandle_t) == handle_bytes && sizeof(cudaIpcEventHandle_t) == handle_bytes);

namespace {
/// An interprocess event recorded on the current stream of `device`; destroyed with it.
struct ipc_event {
  explicit ipc_event(int device) : device(device) {
    troupe::detail::device_guard on(device);
    troupe::detail::check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess), "cudaEventCreateWithFlags");
  }
  ~ipc_event() { static_cast<void>(cudaEventDestroy(ev)); }
  ipc_event(const ipc_event&) = delete;
  ipc_event& operator=(const ipc_event&) = delete;
  int device;
  cudaEvent_t ev = nullptr;
};
}  // namespace

bool write_tensor_ipc(writer& w, const tensor& t, std::int32_t to, std::vector<std::shared_ptr<const void>>& keep) {
  try {
    // A private copy on the caller's current stream. The caller may overwrite or free `t` as
    // soon as the call returned its future, as with staging. The caching allocator hands out whole
    // cudaMalloc blocks: a plain storage's data is the base of its allocation.
    const tensor c = t.is_contiguous() ? t.clone() : t.contiguous();
    if (!c.is_contiguous()) return false;
    // hands out whole cudaMalloc blocks: a plain storage's data is the base.
    if (c.nbytes() == 0 || c.storage()->kind() != storage_kind::plain) return false;
    const int dev = c.device().index;
    const auto* base = static_cast<const char*>(c.storage()->data());
    const std::uint64_t offset = static_cast<std::uint64_t>(c.storage_offset()) * c.element_size();
    const std::uint64_t extent = c.storage()->nbytes();
    if (offset + c.nbytes() > extent) return false;
    cudaIpcMemHandle_t mem;
    cudaIpcEventHandle_t evh;
    auto ev = std::make_shared<ipc_event>(dev);
    {
      troupe::detail::device_guard on(dev);
      troupe::detail::check(cudaIpcGetMemHandle(&mem, const_cast<char*>(base)), "cudaIpcGetMemHandle");
      troupe::detail::check(cudaEventRecord(ev->ev, static_cast<cudaStream_t>(cuda::current_stream(dev))), "cudaEventRecord");
      troupe::detail::check(cudaIpcGetEventHandle(&evh, ev->ev), "cudaIpcGetEventHandle");
    }
    w.pod(std::uint8_t{5});  // kind 5: an IPC handle for a device of the receiver
    w.pod(std::uint8_t{1});  // defined
    w.pod(to);
    write_tensor_header(w, c);
    w.raw(&mem, handle_bytes);
    w.pod(offset);
    w.pod(extent);
    w.raw(&evh, handle_bytes);
    keep.push_back(std::make_shared<tensor>(c));
    keep.push_back(std::move(ev));
    return true;
  } catch (const error&) {
    return false;  // staged instead (counted by the caller)
  }
}

tensor read_tensor_ipc(reader& r, const shape_t& sizes, troupe::dtype dt, std::uint64_t nbytes, std::int32_t to,
                       troupe::detail::cuda_ipc_cache* cache, const std::string& peer) {
  std::string mem(handle_bytes, '\0');
  cudaIpcEventHandle_t evh;
  std::uint64_t offset = 0, extent = 0;
  r.raw(mem.data(), handle_bytes);
  r.pod(offset);
  r.pod(extent);
  r.raw(&evh, handle_bytes);
  check_ipc_range(nbytes, offset, extent);
  check_device_present(sizes, to);
  troupe::detail::cuda_ipc_cache local;  // no node cache: opened for this tensor only
  const auto mapping = (cache ? cache : &local)->open(peer, to, mem);
  tensor out = empty(sizes, tensor_options{dt, cuda_device(to)});
  troupe::detail::device_guard on(to);
  const auto stream = static_cast<cudaStream_t>(cuda::current_stream(to));
  cudaEvent_t ev = nullptr;
  troupe::detail::check(cudaIpcOpenEventHandle(&ev, evh), "cudaIpcOpenEventHandle");
  const cudaError_t waited = cudaStreamWaitEvent(stream, ev, 0);
  static_cast<void>(cudaEventDestroy(ev));  // the wait stays enqueued
  troupe::detail::check(waited, "cudaStreamWaitEvent");
  troupe::detail::check(cudaMemcpyAsync(out.data_ptr(), mapping->base() + offset, nbytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
  cuda::event ready(to);  // the stream rule: ready on every stream before the function runs
  ready.record();
  ready.synchronize();
  return out;
}
#else
bool write_tensor_ipc(writer&, const tensor&, std::int32_t, std::vector<std::shared_ptr<const void>>&) { return false; }

tensor read_tensor_ipc(reader& r, const shape_t& sizes, troupe::dtype, std::uint64_t nbytes, std::int32_t to, troupe::detail::cuda_ipc_cache*,
                       const std::string&) {
  std::uint64_t offset = 0, extent = 0;
  r.skip(handle_bytes);
  r.pod(offset);
  r.pod(extent);
  r.skip(handle_bytes);
  check_ipc_range(nbytes, offset, extent);  // the same checks, in the same order, as with CUDA
  check_device_present(sizes, to);
  throw error(errc::device_mismatch, "an rpc CUDA tensor arrived by IPC handle, but this build has no CUDA backend");
}
#endif

}  // namespace troupe::rpc::detail
