#pragma once
/// \file shared_memory.hpp
/// CPU tensors in shared memory, with the two strategies of torch.multiprocessing:
/// - `file_descriptor`: an anonymous memfd segment. The storage owns the mapping and the fd.
///   The fd crosses to another process over a Unix socket (SCM_RIGHTS, `shm_channel`);
/// - `file_system`: a named POSIX segment (`shm_open`); the handle is its name and size. A
///   `shm_manager` process unlinks the segments of processes that died (Note [shm manager]).
/// Every segment, mapping, fd and socket here is a move-only RAII type. Errors are
/// troupe::error(io_error) naming the segment, the syscall and the errno text.

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "troupe/tensors/storage.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe {

/// How a shared storage is identified across processes.
enum class sharing_strategy : std::uint8_t { file_descriptor = 0, file_system = 1 };

/// "file_descriptor" / "file_system".
const char* to_string(sharing_strategy s) noexcept;

/// The name prefix of every file_system segment of `job`: "/troupe_<job>_" (its file is
/// /dev/shm/troupe_<job>_...). Throws bad_argument unless `job` is 1-64 letters, digits, '-', '_'.
std::string shm_name_prefix(const std::string& job);

/// Owning file descriptor: closes on destruction. Move-only.
class unique_fd {
 public:
  unique_fd() = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(o.release()) {}
  unique_fd& operator=(unique_fd&& o) noexcept { reset(o.release()); return *this; }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  int get() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Gives up ownership and returns the fd.
  int release() noexcept { const int f = fd_; fd_ = -1; return f; }
  /// Closes the current fd (if any) and owns `fd`.
  void reset(int fd = -1) noexcept;

 private:
  int fd_ = -1;
};

/// Serialisable description of one shared segment. For file_descriptor the fd is local to this
/// process and is NOT serialised: it travels beside the message (SCM_RIGHTS, see shm_channel).
struct shm_handle {
  sharing_strategy strategy = sharing_strategy::file_descriptor;
  /// file_system: the shm_open name ("/troupe_job_..."); file_descriptor: the memfd's name.
  std::string name;
  /// Usable size in bytes.
  std::uint64_t nbytes = 0;
  /// file_descriptor: a descriptor of the segment in this process (not owned), else -1.
  int fd = -1;
};

/// CAF-style inspection (the fd is deliberately left out).
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shm_handle& x) {
  return f(x.strategy, x.name, x.nbytes);
}

/// A mapped shared-memory segment. Move-only. The destructor unmaps it and closes its fd. If it
/// owns the name (the creator of a file_system segment), it then shm_unlinks it. Then it calls
/// the unlink hook, which unregisters it from a shm_manager.
class shm_segment {
 public:
  shm_segment() = default;
  shm_segment(shm_segment&& o) noexcept;
  shm_segment& operator=(shm_segment&& o) noexcept;
  shm_segment(const shm_segment&) = delete;
  shm_segment& operator=(const shm_segment&) = delete;
  ~shm_segment();

  /// A new anonymous memfd segment of `nbytes` (zero-filled); `name` is only for diagnostics.
  static shm_segment create_memfd(std::size_t nbytes, const std::string& name);
  /// A new named segment (shm_open O_CREAT|O_EXCL, mode 0600); this object owns the name.
  static shm_segment create_named(std::size_t nbytes, const std::string& name);
  /// Maps a received memfd (the fd is dup'ed; the caller keeps its own). Checks the size.
  static shm_segment map_fd(int fd, std::size_t nbytes, const std::string& name);
  /// Maps an existing named segment without owning the name. Checks the size.
  static shm_segment open_named(const std::string& name, std::size_t nbytes);

  void* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return nbytes_; }
  int fd() const noexcept { return fd_.get(); }
  const std::string& name() const noexcept { return name_; }
  sharing_strategy strategy() const noexcept { return strategy_; }
  bool owns_name() const noexcept { return owns_name_; }
  /// The handle that lets another process map this segment.
  shm_handle handle() const;
  /// Called with the name right after this segment shm_unlinks it (runs in the destructor; must
  /// not throw).
  void set_unlink_hook(std::function<void(const std::string&)> hook) { unlink_hook_ = std::move(hook); }

 private:
  void reset() noexcept;
  void* data_ = nullptr;
  std::size_t nbytes_ = 0;
  std::size_t mapped_ = 0;  // >= 1: mmap of 0 bytes is not allowed
  unique_fd fd_;
  std::string name_;
  sharing_strategy strategy_ = sharing_strategy::file_descriptor;
  bool owns_name_ = false;
  std::function<void(const std::string&)> unlink_hook_;
};

/// The manager of one job's file_system segments: a small process, forked by start(). Every
/// process of the job registers the segments it creates with it (shm_manager_client). When a
/// client's connection closes (its process exited or was killed), the manager shm_unlinks the
/// segments that client still had registered. When the owner stops it, or dies, it unlinks
/// every registered segment and exits. See Note [shm manager]. Move-only; the destructor calls
/// stop().
class shm_manager {
 public:
  /// Forks the manager process listening on an abstract Unix socket. Blocks only for the fork.
  /// `job` names the segments ("/troupe_<job>_..."): letters, digits, '-' and '_' only
  /// (bad_argument otherwise). Throws io_error if a socket call or fork fails. Call it before
  /// starting threads (the fork-safety rule of spawn.hpp).
  static shm_manager start(const std::string& job);

  shm_manager(shm_manager&& o) noexcept;
  shm_manager& operator=(shm_manager&& o) noexcept;
  shm_manager(const shm_manager&) = delete;
  shm_manager& operator=(const shm_manager&) = delete;
  ~shm_manager();

  /// Address for shm_manager_client::connect (an abstract socket name, printable).
  const std::string& address() const noexcept { return address_; }
  const std::string& job() const noexcept { return job_; }
  /// Pid of the manager process (-1 once stopped).
  pid_t pid() const noexcept { return pid_; }
  /// Makes the manager unlink every registered segment and exit; waits up to `timeout`, then
  /// SIGKILLs and reaps it. Idempotent; blocks; never throws.
  void stop(std::chrono::milliseconds timeout = std::chrono::seconds(5)) noexcept;

 private:
  shm_manager() = default;
  std::string job_;
  std::string address_;
  pid_t pid_ = -1;
  unique_fd control_;  // write end of the pipe the manager watches
};

/// One process's connection to a shm_manager. Thread-safe. Each process connects its own
/// client after fork (a client inherited through fork() refuses to work: invalid_state).
class shm_manager_client {
 public:
  /// Connects to the manager at `address` (io_error when none listens there).
  static std::shared_ptr<shm_manager_client> connect(const std::string& address, const std::string& job);

  struct passkey {
   private:
    friend class shm_manager_client;
    passkey() = default;
  };
  /// Use connect().
  shm_manager_client(passkey, unique_fd sock, std::string job);

  /// Registers `name` before the segment exists, so a crash right after shm_open leaks nothing.
  /// Blocks until the manager acknowledges or `timeout` (errc::timeout); io_error if it is gone.
  void register_segment(const std::string& name, std::chrono::milliseconds timeout = std::chrono::seconds(5));
  /// Unregisters `name` (after the owner unlinked it). Same blocking and errors.
  void unregister_segment(const std::string& name, std::chrono::milliseconds timeout = std::chrono::seconds(5));
  /// Returns once the manager has handled everything that happened before this call. That
  /// includes the death of processes that exited earlier, whose segments are unlinked by then. Same
  /// blocking and errors as register_segment.
  void sync(std::chrono::milliseconds timeout = std::chrono::seconds(5));
  const std::string& job() const noexcept { return job_; }

 private:
  void request(char op, const std::string& name, std::chrono::milliseconds timeout);
  std::mutex mu_;
  unique_fd sock_;
  std::string job_;
  pid_t pid_;
};

/// The runtime's shared_memory_provider: share() copies a storage's bytes into a new segment of
/// its strategy and swaps it in. So every view of the storage follows. Thread-safe.
class shm_provider final : public shared_memory_provider {
 public:
  /// file_descriptor strategy (memfd). `job` names the segments in diagnostics.
  explicit shm_provider(std::string job = "troupe");
  /// file_system strategy; each segment is registered with `client` (may be null: no cleanup of
  /// the segments of a killed process). Throws bad_argument for a malformed `job`.
  shm_provider(sharing_strategy strategy, std::string job, std::shared_ptr<shm_manager_client> client = nullptr);

  /// Moves `s` (CPU) into a new shared segment; no-op when it already is shared. Throws
  /// device_mismatch for a CUDA storage, io_error when the segment cannot be made.
  void share(storage& s) override;
  /// A new, zero-filled shared storage of `nbytes`.
  std::shared_ptr<storage> allocate(std::size_t nbytes);
  sharing_strategy strategy() const noexcept { return strategy_; }

 private:
  shm_segment make_segment(std::size_t nbytes);
  sharing_strategy strategy_;
  std::string job_;
  std::shared_ptr<shm_manager_client> client_;
  std::string prefix_;  // "/troupe_<job>_<pid>_<random>_"
  std::atomic<std::uint64_t> counter_{0};
};

/// Moves the tensor's storage into shared memory through `provider` (all views of it follow);
/// returns `t`. No-op if already shared. Throws device_mismatch for a CUDA tensor.
tensor& share_memory_(tensor& t, shared_memory_provider& provider);
/// True if the tensor's storage lives in shared memory.
bool is_shared(const tensor& t);
/// The handle of a shared tensor's storage (invalid_state if the tensor is not shared by this
/// module). For file_descriptor, `fd` is the storage's own descriptor: dup it to keep it.
shm_handle shared_handle_of(const tensor& t);
/// Rebuilds a tensor over a shared segment in another process. It maps `h` and views it with
/// the given geometry: the fd is dup'ed for file_descriptor, the name opened for file_system.
/// Throws bad_argument when the geometry exceeds the segment, io_error when it cannot be mapped.
tensor tensor_from_shared_handle(const shm_handle& h, troupe::dtype dtype, const shape_t& shape,
                                 const shape_t& strides, std::int64_t offset);

/// Everything needed to rebuild a shared tensor elsewhere (serialisable; see inspect).
struct shared_tensor_meta {
  shm_handle storage;
  troupe::dtype dtype = troupe::dtype::float32;
  shape_t sizes;
  shape_t strides;
  std::int64_t offset = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shared_tensor_meta& x) {
  return f(x.storage, x.dtype, x.sizes, x.strides, x.offset);
}

/// The meta of a shared tensor (invalid_state if it is not shared).
shared_tensor_meta describe_shared(const tensor& t);
/// tensor_from_shared_handle(m.storage, m.dtype, m.sizes, m.strides, m.offset).
tensor tensor_from_shared_meta(const shared_tensor_meta& m);

/// Sends a shared tensor over a connected Unix SOCK_SEQPACKET socket: one message carrying its
/// meta and, for file_descriptor, its fd (SCM_RIGHTS). Blocks up to `timeout` for buffer space
/// (errc::timeout). invalid_state if `t` is not shared; io_error if sendmsg fails.
void send_tensor_fd(int socket, const tensor& t, std::chrono::milliseconds timeout = std::chrono::seconds(10));
/// Receives one tensor sent by send_tensor_fd and maps its segment (writes are visible both
/// ways). Blocks up to `timeout` (errc::timeout); io_error if the peer closed the socket;
/// protocol_violation for a malformed message.
tensor recv_tensor_fd(int socket, std::chrono::milliseconds timeout = std::chrono::seconds(10));

/// One end of a Unix SOCK_SEQPACKET socket pair that carries shared tensors. Move-only.
/// Make the pair before spawn(); each process keeps one end.
class shm_channel {
 public:
  /// A connected pair (io_error if socketpair fails).
  static std::pair<shm_channel, shm_channel> make_pair();
  explicit shm_channel(unique_fd socket) : sock_(std::move(socket)) {}

  /// See send_tensor_fd.
  void send(const tensor& t, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    send_tensor_fd(sock_.get(), t, timeout);
  }
  /// See recv_tensor_fd.
  tensor recv(std::chrono::milliseconds timeout = std::chrono::seconds(10)) { return recv_tensor_fd(sock_.get(), timeout); }
  int fd() const noexcept { return sock_.get(); }
  /// Closes this end (the peer's recv then fails with io_error).
  void close() noexcept { sock_.reset(); }

 private:
  unique_fd sock_;
};

}  // namespace troupe
