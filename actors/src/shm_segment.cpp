// Shared-memory segments (memfd and named POSIX shm) and the owning fd.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "troupe/actors/shared_memory.hpp"

namespace troupe {

namespace {

[[noreturn]] void throw_io(const std::string& what, const std::string& segment, const char* call) {
  const int e = errno;
  throw error(errc::io_error, what + " '" + segment + "': " + call + ": " + std::strerror(e));
}

// Maps `fd` shared read-write; `mapped` is at least 1 byte. MAP_POPULATE allocates and maps every
// page in one call. A tensor segment is written or read whole. One populate costs far less than
// a page fault per 4 KB (64 MB copy-in: see bench/shm_bench.cpp).
void* map_shared(int fd, std::size_t mapped, const std::string& what, const std::string& name) {
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) throw_io(what, name, "mmap");
  return p;
}

// Checks that the object behind `fd` holds at least `nbytes`.
void check_size(int fd, std::size_t nbytes, const std::string& what, const std::string& name) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw_io(what, name, "fstat");
  if (static_cast<std::size_t>(st.st_size) < nbytes)
    throw error(errc::bad_argument, what + " '" + name + "': segment holds " + std::to_string(st.st_size) +
                                        " bytes, the handle claims " + std::to_string(nbytes));
}

}  // namespace

const char* to_string(sharing_strategy s) noexcept {
  return s == sharing_strategy::file_system ? "file_system" : "file_descriptor";
}

void unique_fd::reset(int fd) noexcept {
  if (fd_ >= 0 && fd_ != fd) ::close(fd_);
  fd_ = fd;
}

shm_segment::shm_segment(shm_segment&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      nbytes_(std::exchange(o.nbytes_, 0)),
      mapped_(std::exchange(o.mapped_, 0)),
      fd_(std::move(o.fd_)),
      name_(std::move(o.name_)),
      strategy_(o.strategy_),
      owns_name_(std::exchange(o.owns_name_, false)),
      unlink_hook_(std::move(o.unlink_hook_)) {}

shm_segment& shm_segment::operator=(shm_segment&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = std::exchange(o.data_, nullptr);
    nbytes_ = std::exchange(o.nbytes_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
    fd_ = std::move(o.fd_);
    name_ = std::move(o.name_);
    strategy_ = o.strategy_;
    owns_name_ = std::exchange(o.owns_name_, false);
    unlink_hook_ = std::move(o.unlink_hook_);
  }
  return *this;
}

shm_segment::~shm_segment() { reset(); }

void shm_segment::reset() noexcept {
  if (data_ != nullptr) ::munmap(data_, mapped_);
  data_ = nullptr;
  fd_.reset();
  if (owns_name_) {
    ::shm_unlink(name_.c_str());
    owns_name_ = false;
    if (unlink_hook_) unlink_hook_(name_);
  }
  unlink_hook_ = nullptr;
}

shm_handle shm_segment::handle() const {
  shm_handle h;
  h.strategy = strategy_;
  h.name = name_;
  h.nbytes = nbytes_;
  h.fd = strategy_ == sharing_strategy::file_descriptor ? fd_.get() : -1;
  return h;
}

shm_segment shm_segment::create_memfd(std::size_t nbytes, const std::string& name) {
  shm_segment s;
  s.name_ = name;
  s.strategy_ = sharing_strategy::file_descriptor;
  s.nbytes_ = nbytes;
  s.mapped_ = std::max<std::size_t>(nbytes, 1);
  s.fd_.reset(::memfd_create(name.c_str(), MFD_CLOEXEC));
  if (!s.fd_) throw_io("shm_segment::create_memfd", name, "memfd_create");
  if (::ftruncate(s.fd_.get(), static_cast<off_t>(s.mapped_)) != 0) throw_io("shm_segment::create_memfd", name, "ftruncate");
  s.data_ = map_shared(s.fd_.get(), s.mapped_, "shm_segment::create_memfd", name);
  return s;
}

shm_segment shm_segment::create_named(std::size_t nbytes, const std::string& name) {
  shm_segment s;
  s.name_ = name;
  s.strategy_ = sharing_strategy::file_system;
  s.nbytes_ = nbytes;
  s.mapped_ = std::max<std::size_t>(nbytes, 1);
  unique_fd fd(::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd) throw_io("shm_segment::create_named", name, "shm_open");
  s.owns_name_ = true;  // from here on the destructor unlinks it, whatever fails next
  if (::ftruncate(fd.get(), static_cast<off_t>(s.mapped_)) != 0) throw_io("shm_segment::create_named", name, "ftruncate");
  s.data_ = map_shared(fd.get(), s.mapped_, "shm_segment::create_named", name);
  return s;  // the fd closes here: a named segment is found again by its name
}

shm_segment shm_segment::map_fd(int fd, std::size_t nbytes, const std::string& name) {
  shm_segment s;
  s.name_ = name;
  s.strategy_ = sharing_strategy::file_descriptor;
  s.nbytes_ = nbytes;
  s.mapped_ = std::max<std::size_t>(nbytes, 1);
  s.fd_.reset(::fcntl(fd, F_DUPFD_CLOEXEC, 0));
  if (!s.fd_) throw_io("shm_segment::map_fd", name, "fcntl(F_DUPFD_CLOEXEC)");
  check_size(s.fd_.get(), s.mapped_, "shm_segment::map_fd", name);
  s.data_ = map_shared(s.fd_.get(), s.mapped_, "shm_segment::map_fd", name);
  return s;
}

shm_segment shm_segment::open_named(const std::string& name, std::size_t nbytes) {
  shm_segment s;
  s.name_ = name;
  s.strategy_ = sharing_strategy::file_system;
  s.nbytes_ = nbytes;
  s.mapped_ = std::max<std::size_t>(nbytes, 1);
  unique_fd fd(::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0));
  if (!fd) throw_io("shm_segment::open_named", name, "shm_open");
  check_size(fd.get(), s.mapped_, "shm_segment::open_named", name);
  s.data_ = map_shared(fd.get(), s.mapped_, "shm_segment::open_named", name);
  return s;
}

}  // namespace troupe
