// The file_system strategy's segment manager process and its client. See Note [shm manager].
//
// Note [shm manager]
// ~~~~~~~~~~~~~~~~~~
// A named segment outlives a process that is killed before it shm_unlinks it; it keeps using
// memory until reboot. shm_manager::start() binds an abstract Unix SOCK_SEQPACKET socket, then
// forks the manager process. The manager calls setsid, so a terminal ^C aimed at the job spares
// it. It closes every inherited fd but its own, so it never holds a job's socket open. Every
// process of the job connects one shm_manager_client (after its fork). It registers each name
// BEFORE creating the segment, so there is no window in which a crash leaks an unregistered
// segment:
//
//   client process                manager                          owner (start())
//   register "/troupe_j_.." --->  names[client] += name  (uid and prefix checked)
//                           <---  'k'
//   shm_open(O_CREAT|O_EXCL) ... use ... shm_unlink
//   unregister name         --->  names[client] -= name
//                           <---  'k'
//   (killed: socket EOF)    --->  shm_unlink(names[client]) (ENOENT is fine)
//                                 control 'q', pipe EOF, or
//                                 the owner died (getppid changed) ---> unlink all, _exit(0)
//
// Guarantees: a segment registered by a process that dies is unlinked as soon as the manager
// sees that process's socket close. When the owner stops the manager (or dies), every segment
// still registered is unlinked. Mappings that other processes already hold stay valid (unlink
// removes only the name); a process that opens the name afterwards gets ENOENT (io_error).
// Assumes a client socket is not shared with forked children (the client refuses to run in a
// process other than the one that connected it).

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "troupe/actors/shared_memory.hpp"

namespace troupe {

namespace {

constexpr char op_register = 'R';
constexpr char op_unregister = 'U';
constexpr char op_sync = 'S';
constexpr char reply_ok = 'k';
constexpr char reply_refused = 'x';
constexpr std::size_t max_message = 512;

std::string errno_text(const char* call) {
  const int e = errno;
  return std::string(call) + ": " + std::strerror(e);
}

// The printable address "@name" as an abstract sockaddr (leading NUL, no terminator).
sockaddr_un abstract_address(const std::string& address, socklen_t& len) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (address.size() < 2 || address[0] != '@' || address.size() > sizeof(sa.sun_path))
    throw error(errc::bad_argument, "shm manager address '" + address + "' is not an abstract socket name (@...)");
  std::memcpy(sa.sun_path + 1, address.data() + 1, address.size() - 1);
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + address.size());
  return sa;
}

// The manager process: serves clients until stopped; never returns.
class manager_loop {
 public:
  manager_loop(int listen_fd, int control_fd, std::string prefix, pid_t owner)
      : listen_(listen_fd), control_(control_fd), prefix_(std::move(prefix)), owner_(owner) {}

  [[noreturn]] void run() {
    for (;;) {
      std::vector<pollfd> fds{{control_, POLLIN, 0}, {listen_, POLLIN, 0}};
      for (const auto& [fd, names] : clients_) fds.push_back({fd, POLLIN, 0});
      ::poll(fds.data(), fds.size(), 500);  // the timeout bounds how late an owner's death is seen
      if (::getppid() != owner_ || fds[0].revents != 0) shutdown();
      if (fds[1].revents & POLLIN) accept_client();
      // Hang-ups first: a request that arrives together with an older client death is answered
      // after that client's segments are gone (what shm_manager_client::sync promises).
      for (std::size_t i = 2; i < fds.size(); ++i)
        if (fds[i].revents & (POLLHUP | POLLERR)) drop_client(fds[i].fd);
      for (std::size_t i = 2; i < fds.size(); ++i)
        if ((fds[i].revents & POLLIN) && !(fds[i].revents & (POLLHUP | POLLERR))) serve(fds[i].fd);
    }
  }

 private:
  [[noreturn]] void shutdown() {
    for (auto& [fd, names] : clients_) drop_names(names);
    ::_exit(0);
  }

  static void drop_names(std::set<std::string>& names) {
    for (const auto& n : names) ::shm_unlink(n.c_str());
    names.clear();
  }

  void accept_client() {
    const int fd = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return;
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != ::getuid()) {
      ::close(fd);  // another user may not make us unlink anything
      return;
    }
    clients_[fd];
  }

  // The client process exited or was killed: unlink what it still had registered.
  void drop_client(int fd) {
    drop_names(clients_[fd]);
    ::close(fd);
    clients_.erase(fd);
  }

  void serve(int fd) {
    char buf[max_message];
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) return drop_client(fd);
    auto& names = clients_[fd];
    const std::string name(buf + 1, static_cast<std::size_t>(n - 1));
    char reply = reply_ok;
    if (buf[0] == op_sync) reply = reply_ok;
    else if (name.rfind(prefix_, 0) != 0 || name.find('/', 1) != std::string::npos) reply = reply_refused;
    else if (buf[0] == op_register) names.insert(name);
    else if (buf[0] == op_unregister) names.erase(name);
    else reply = reply_refused;
    ::send(fd, &reply, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  int listen_;
  int control_;
  std::string prefix_;
  pid_t owner_;
  std::map<int, std::set<std::string>> clients_;
};

// Closes every fd of the (just forked) manager except 0-2 and the two it serves.
void close_inherited_fds(int a, int b) {
  if (a > b) std::swap(a, b);
  ::syscall(SYS_close_range, 3u, static_cast<unsigned>(a - 1), 0u);
  ::syscall(SYS_close_range, static_cast<unsigned>(a + 1), static_cast<unsigned>(b - 1), 0u);
  ::syscall(SYS_close_range, static_cast<unsigned>(b + 1), ~0u, 0u);
}

}  // namespace

std::string shm_name_prefix(const std::string& job) {
  const bool ok = !job.empty() && job.size() <= 64 &&
                  job.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") ==
                      std::string::npos;
  if (!ok)
    throw error(errc::bad_argument,
                "shared memory job name '" + job + "' must be 1-64 letters, digits, '-' or '_'");
  return "/troupe_" + job + "_";
}

shm_manager shm_manager::start(const std::string& job) {
  shm_manager m;
  m.job_ = job;
  const std::string prefix = shm_name_prefix(job);
  m.address_ = "@troupe-shm-" + job + "-" + std::to_string(::getpid()) + "-" + std::to_string(std::random_device{}());
  socklen_t len = 0;
  const sockaddr_un sa = abstract_address(m.address_, len);
  unique_fd listener(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!listener) throw error(errc::io_error, "shm_manager::start: " + errno_text("socket"));
  if (::bind(listener.get(), reinterpret_cast<const sockaddr*>(&sa), len) != 0 || ::listen(listener.get(), 128) != 0)
    throw error(errc::io_error, "shm_manager::start: " + m.address_ + ": " + errno_text("bind/listen"));
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) throw error(errc::io_error, "shm_manager::start: " + errno_text("pipe2"));
  unique_fd control_read(p[0]);
  m.control_.reset(p[1]);
  const pid_t owner = ::getpid();
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw error(errc::io_error, "shm_manager::start: " + errno_text("fork"));
  if (pid == 0) {
    ::setsid();
    ::signal(SIGINT, SIG_IGN);
    close_inherited_fds(listener.get(), control_read.get());
    manager_loop(listener.get(), control_read.get(), prefix, owner).run();
  }
  m.pid_ = pid;
  return m;
}

shm_manager::shm_manager(shm_manager&& o) noexcept
    : job_(std::move(o.job_)), address_(std::move(o.address_)), pid_(std::exchange(o.pid_, -1)),
      control_(std::move(o.control_)) {}

shm_manager& shm_manager::operator=(shm_manager&& o) noexcept {
  if (this != &o) {
    stop();
    job_ = std::move(o.job_);
    address_ = std::move(o.address_);
    pid_ = std::exchange(o.pid_, -1);
    control_ = std::move(o.control_);
  }
  return *this;
}

shm_manager::~shm_manager() { stop(); }

void shm_manager::stop(std::chrono::milliseconds timeout) noexcept {
  if (pid_ < 0) return;
  const char q = 'q';
  if (control_) (void)!::write(control_.get(), &q, 1);
  control_.reset();
  unique_fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    pollfd pfd{pidfd.get(), POLLIN, 0};
    ::poll(&pfd, pidfd ? 1 : 0, pidfd ? static_cast<int>(left.count()) : 10);
  }
  pid_ = -1;
}

shm_manager_client::shm_manager_client(passkey, unique_fd sock, std::string job)
    : sock_(std::move(sock)), job_(std::move(job)), pid_(::getpid()) {}

std::shared_ptr<shm_manager_client> shm_manager_client::connect(const std::string& address, const std::string& job) {
  shm_name_prefix(job);  // validates
  socklen_t len = 0;
  const sockaddr_un sa = abstract_address(address, len);
  unique_fd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock) throw error(errc::io_error, "shm_manager_client::connect: " + errno_text("socket"));
  if (::connect(sock.get(), reinterpret_cast<const sockaddr*>(&sa), len) != 0)
    throw error(errc::io_error, "shm_manager_client::connect to " + address + ": " + errno_text("connect"));
  return std::make_shared<shm_manager_client>(passkey{}, std::move(sock), job);
}

void shm_manager_client::register_segment(const std::string& name, std::chrono::milliseconds timeout) {
  request(op_register, name, timeout);
}

void shm_manager_client::unregister_segment(const std::string& name, std::chrono::milliseconds timeout) {
  request(op_unregister, name, timeout);
}

void shm_manager_client::sync(std::chrono::milliseconds timeout) { request(op_sync, "", timeout); }

void shm_manager_client::request(char op, const std::string& name, std::chrono::milliseconds timeout) {
  const char* verb = op == op_register ? "register" : op == op_unregister ? "unregister" : "sync";
  const std::string what = std::string("shm manager ") + verb + " '" + name + "'";
  if (name.size() + 1 > max_message) throw error(errc::bad_argument, what + ": name too long");
  std::lock_guard<std::mutex> lock(mu_);
  if (::getpid() != pid_)
    throw error(errc::invalid_state, what + ": client was connected by process " + std::to_string(pid_) +
                                         "; connect a new client in each forked process");
  const std::string msg = op + name;
  if (::send(sock_.get(), msg.data(), msg.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(msg.size()))
    throw error(errc::io_error, what + ": " + errno_text("send"));
  pollfd pfd{sock_.get(), POLLIN, 0};
  int r = 0;
  while ((r = ::poll(&pfd, 1, static_cast<int>(timeout.count()))) < 0 && errno == EINTR) {
  }
  if (r == 0) throw error(errc::timeout, what + ": no reply within " + std::to_string(timeout.count()) + " ms");
  char reply = 0;
  const ssize_t n = ::recv(sock_.get(), &reply, 1, 0);
  if (n <= 0) throw error(errc::io_error, what + ": the manager closed the connection");
  if (reply == reply_refused)
    throw error(errc::bad_argument, what + ": refused (the name must start with " + shm_name_prefix(job_) + ")");
}

}  // namespace troupe
