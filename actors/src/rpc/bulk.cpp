// Note [tensor over shared memory] (bulk.hpp).
#include "rpc/bulk.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "troupe/actors/rpc/codec.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::detail {

namespace {

thread_local bool tl_enabled = false;
thread_local bulk_names* tl_names = nullptr;
std::atomic<std::uint64_t> counter{0};
constexpr const char* prefix = "/troupe_rpc_";

// Maps `fd` (nbytes, read-write, pages populated in one go rather than faulted one by one);
// closes fd.
void* map_segment(int fd, std::size_t nbytes, const std::string& name) {
  void* p = ::mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) throw error(errc::io_error, "mmap of shared-memory segment " + name + " failed: " + std::strerror(errno));
  return p;
}

}  // namespace

void bulk_names::add(std::string name) {
  std::lock_guard<std::mutex> lock(mutex_);
  names_.push_back(std::move(name));
}

void bulk_names::unlink_all() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& n : names_) ::shm_unlink(n.c_str());  // ENOENT: the receiver already did
  names_.clear();
}

bulk_scope::bulk_scope(bool enabled, bulk_names* names) : prev_enabled_(tl_enabled), prev_names_(tl_names) {
  tl_enabled = enabled;
  tl_names = names;
}

bulk_scope::~bulk_scope() {
  tl_enabled = prev_enabled_;
  tl_names = prev_names_;
}

bool same_host(const caf::node_id& a, const caf::node_id& b) {
  if (!a || !b) return false;
  const auto* x = dynamic_cast<const caf::node_id::default_data*>(&*a);
  const auto* y = dynamic_cast<const caf::node_id::default_data*>(&*b);
  return x && y && x->host_id() == y->host_id();
}

}  // namespace troupe::detail

namespace troupe::rpc::detail {

bool write_tensor_bulk(oarchive& ar, const tensor& h) {
  const std::size_t nbytes = h.nbytes();
  if (!troupe::detail::tl_enabled || nbytes < troupe::detail::bulk_threshold) return false;
  const std::string name = std::string(troupe::detail::prefix) + std::to_string(::getpid()) + "_" +
                           std::to_string(troupe::detail::counter.fetch_add(1));
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return false;  // fall back to inline bytes
  if (::ftruncate(fd, static_cast<off_t>(nbytes)) != 0) {
    ::close(fd);
    ::shm_unlink(name.c_str());
    return false;
  }
  if (troupe::detail::tl_names) troupe::detail::tl_names->add(name);
  void* seg = troupe::detail::map_segment(fd, nbytes, name);
  std::memcpy(seg, h.data_ptr(), nbytes);
  ::munmap(seg, nbytes);
  const std::uint8_t kind = 1, defined = 1;
  ar << kind << defined;
  const auto dt = static_cast<std::uint8_t>(h.dtype());
  const auto rank = static_cast<std::uint32_t>(h.dim());
  ar << dt << rank;
  for (std::int64_t s : h.sizes()) ar << s;
  const std::uint64_t n64 = nbytes;
  ar << n64 << name;
  return true;
}

// The receiver maps the segment and makes it the tensor's storage (no copy out). The name is
// unlinked at once, so the pages live exactly as long as the mapping: the storage's deleter
// unmaps them. The sender unmapped its side before sending, so the mapping is exclusively ours.
tensor read_tensor_bulk(iarchive& ar, const shape_t& sizes, troupe::dtype dt, std::uint64_t nbytes) {
  std::string name;
  ar >> name;
  if (name.rfind(troupe::detail::prefix, 0) != 0 || name.find('/', 1) != std::string::npos)
    throw error(errc::protocol_violation, "shared-memory tensor name '" + name + "' is not a troupe rpc segment");
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) throw error(errc::io_error, "shared-memory tensor " + name + " is gone: " + std::strerror(errno));
  ::shm_unlink(name.c_str());
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) != nbytes) {
    ::close(fd);
    throw error(errc::protocol_violation, "shared-memory tensor " + name + " has the wrong size");
  }
  if (nbytes == 0) {
    ::close(fd);
    return empty(sizes, tensor_options{dt});
  }
  void* p = troupe::detail::map_segment(fd, nbytes, name);
  // The deleter's context carries the mapping's length.
  data_ptr mapping(p, cpu_device,
                   [](void* ctx, void* q) noexcept { ::munmap(q, reinterpret_cast<std::uintptr_t>(ctx)); },
                   reinterpret_cast<void*>(static_cast<std::uintptr_t>(nbytes)));
  auto impl = std::make_shared<tensor_impl>();
  impl->storage = std::make_shared<storage>(std::move(mapping), nbytes, storage_kind::shared_memory);
  impl->sizes = sizes;
  impl->strides = contiguous_strides(sizes);
  impl->dtype = dt;
  return tensor(std::move(impl));
}

}  // namespace troupe::rpc::detail
