// The shared arena of the shared-memory process group (Note [shm zero copy]).
#include "shm_arena.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "troupe/tensors/error.hpp"

namespace troupe::ddp::detail {

namespace {

constexpr std::size_t page = 4096;

[[noreturn]] void throw_io(const std::string& name, const char* call) {
  const int e = errno;
  throw error(errc::io_error, "process_group arena '" + name + "': " + call + ": " + std::strerror(e));
}

std::byte* map_fd(int fd, std::size_t nbytes, const std::string& name) {
  void* p = ::mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (p == MAP_FAILED) throw_io(name, "mmap");
  return static_cast<std::byte*>(p);
}

/// Keeps the arena alive while a tensor uses one of its ranges.
struct lease {
  std::shared_ptr<shm_arena> arena;
  std::size_t off;
  std::size_t len;
};

}  // namespace

sparse_mapping sparse_mapping::create(const std::string& name, std::size_t nbytes) {
  sparse_mapping m;
  m.fd_ = ::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (m.fd_ < 0) throw_io(name, "shm_open");
  if (::ftruncate(m.fd_, static_cast<off_t>(nbytes)) != 0) {
    ::shm_unlink(name.c_str());
    throw_io(name, "ftruncate");
  }
  m.data_ = map_fd(m.fd_, nbytes, name);
  m.size_ = nbytes;
  return m;
}

sparse_mapping sparse_mapping::open(const std::string& name, std::size_t nbytes) {
  sparse_mapping m;
  m.fd_ = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0600);
  if (m.fd_ < 0) throw_io(name, "shm_open");
  struct stat st {};
  if (::fstat(m.fd_, &st) != 0) throw_io(name, "fstat");
  if (static_cast<std::size_t>(st.st_size) < nbytes)
    throw error(errc::io_error, "process_group arena '" + name + "' holds " + std::to_string(st.st_size) +
                                    " bytes, expected " + std::to_string(nbytes));
  m.data_ = map_fd(m.fd_, nbytes, name);
  m.size_ = nbytes;
  return m;
}

sparse_mapping::~sparse_mapping() {
  if (data_ != nullptr) ::munmap(data_, size_);
  if (fd_ >= 0) ::close(fd_);
}

sparse_mapping::sparse_mapping(sparse_mapping&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)), fd_(std::exchange(o.fd_, -1)) {}

sparse_mapping& sparse_mapping::operator=(sparse_mapping&& o) noexcept {
  if (this != &o) {
    sparse_mapping tmp(std::move(o));
    std::swap(data_, tmp.data_);
    std::swap(size_, tmp.size_);
    std::swap(fd_, tmp.fd_);
  }
  return *this;
}

shm_arena::shm_arena(sparse_mapping m) : map_(std::move(m)) {
  if (map_.size() >= page) free_.emplace(0, map_.size() / page * page);
}

tensor shm_arena::allocate(const shape_t& shape, troupe::dtype dt) {
  std::int64_t numel = 1;
  for (auto s : shape) numel *= s;
  const std::size_t nbytes = static_cast<std::size_t>(numel) * element_size(dt);
  const std::size_t len = std::max(page, (nbytes + page - 1) / page * page);
  std::size_t off = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.begin();
    while (it != free_.end() && it->second < len) ++it;
    if (it == free_.end()) return tensor();
    off = it->first;
    const std::size_t rest = it->second - len;
    free_.erase(it);
    if (rest > 0) free_.emplace(off + len, rest);
    used_ += len;
  }
  // Reserve the pages now: a full /dev/shm must not turn into SIGBUS at the first write.
  if (::posix_fallocate(map_.fd(), static_cast<off_t>(off), static_cast<off_t>(len)) != 0) {
    release(off, len);
    return tensor();
  }
  std::memset(map_.data() + off, 0, nbytes);  // a reused range holds old values
  auto* keep = new lease{shared_from_this(), off, len};
  data_ptr dp(map_.data() + off, cpu_device,
              [](void* ctx, void*) noexcept {
                auto* l = static_cast<lease*>(ctx);
                l->arena->release(l->off, l->len);
                delete l;
              },
              keep);
  auto impl = std::make_shared<tensor_impl>();
  // external, not shared_memory: the arena is the group's own; torch.multiprocessing-style
  // sharing (share_memory_, shared_handle_of) knows nothing of it and moves such a tensor out.
  impl->storage = std::make_shared<storage>(std::move(dp), nbytes, storage_kind::external);
  impl->sizes = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dt;
  return tensor(std::move(impl));
}

void shm_arena::release(std::size_t off, std::size_t len) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  used_ -= len;
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + len == next->first) {  // merge with the following range
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {  // merge with the preceding range
      prev->second += len;
      return;
    }
  }
  free_.emplace(off, len);
}

std::uint64_t shm_arena::offset_of(const void* p, std::size_t n) const noexcept {
  const auto* b = static_cast<const std::byte*>(p);
  if (b < map_.data() || b + n > map_.data() + map_.size()) return 0;
  return static_cast<std::uint64_t>(b - map_.data()) + 1;
}

std::size_t shm_arena::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

}  // namespace troupe::ddp::detail
