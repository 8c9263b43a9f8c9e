#pragma once
// Helpers of the multi-process node tests: a pipe that hands rank 0's ephemeral port to forked
// children, and the options of a test node. Every wait is bounded.

#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "troupe/actors/node.hpp"
#include "troupe/tensors/error.hpp"
#include "troupe/tensors/factories.hpp"

namespace troupe::test {

/// A pipe created before spawn(): the parent (rank 0) writes its port once per child, each
/// child reads it with a timeout.
class port_pipe {
 public:
  port_pipe() {
    if (::pipe(fds_) != 0) throw error(errc::io_error, "pipe() failed");
  }
  ~port_pipe() {
    ::close(fds_[0]);
    ::close(fds_[1]);
  }
  port_pipe(const port_pipe&) = delete;
  port_pipe& operator=(const port_pipe&) = delete;

  void publish(std::uint16_t port, int readers) {
    for (int i = 0; i < readers; ++i)
      if (::write(fds_[1], &port, sizeof(port)) != sizeof(port)) throw error(errc::io_error, "port pipe write failed");
  }
  std::uint16_t read(std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    pollfd p{fds_[0], POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(timeout.count())) != 1) throw error(errc::timeout, "no port from rank 0");
    std::uint16_t port = 0;
    if (::read(fds_[0], &port, sizeof(port)) != sizeof(port)) throw error(errc::io_error, "port pipe read failed");
    return port;
  }

 private:
  int fds_[2] = {-1, -1};
};

/// Options of a test node on loopback with a short default deadline.
/// A child's serving loop: announces `ready_key`, serves until the parent sets "done" (bounded
/// by `wait`), then shuts down gracefully.
inline void serve_until_done(node& n, const std::string& ready_key = "ready",
                             std::chrono::seconds wait = std::chrono::seconds(60)) {
  n.store().set(ready_key, "1");
  n.store().get("done", wait);
  n.shutdown(shutdown_mode::graceful, std::chrono::seconds(10));
}

/// Rank 0's side of serve_until_done: tells the serving children to stop, then shuts down
/// gracefully (the children's outstanding calls finish first).
inline void release_children(node& n) {
  n.store().set("done", "1");
  n.shutdown(shutdown_mode::graceful, std::chrono::seconds(10));
}

/// A uint8 tensor of `nbytes` whose bytes depend on `seed` and the position.
inline tensor byte_pattern(std::int64_t nbytes, unsigned seed) {
  auto t = empty({nbytes}, tensor_options{dtype::uint8});
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  for (std::int64_t i = 0; i < nbytes; ++i) p[i] = static_cast<unsigned char>((i * 131 + seed * 7919 + (i >> 12)) & 0xff);
  return t;
}

/// Same shape and bit-identical bytes.
inline bool same_bytes(const tensor& a, const tensor& b) {
  return a.nbytes() == b.nbytes() && a.sizes() == b.sizes() && (a.nbytes() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0);
}

/// Rpc shared-memory segment names in /dev/shm (there should be none: the bulk path uses
/// anonymous memfd segments, and a named one left behind is a leak).
inline int rpc_names_in_dev_shm() {
  int n = 0;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (auto* e = ::readdir(d))
      if (std::strncmp(e->d_name, "troupe_rpc_", 11) == 0) ++n;
    ::closedir(d);
  }
  return n;
}

inline node_options test_options(int rank, int world, std::uint16_t master_port, std::string token = "test-token") {
  node_options o;
  o.rank = rank;
  o.world_size = world;
  o.master_port = master_port;
  o.job_token = std::move(token);
  o.default_timeout = std::chrono::seconds(10);
  o.join_timeout = std::chrono::seconds(10);
  return o;
}

/// Connects to 127.0.0.1:port, writes `bytes`, and returns whether the peer closed the
/// connection within `timeout` (garbage must be dropped, not served).
inline bool connection_dropped_after(std::uint16_t port, const std::vector<char>& bytes,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw error(errc::io_error, "socket() failed");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    throw error(errc::io_error, "cannot connect to port " + std::to_string(port));
  }
  (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  const auto end = std::chrono::steady_clock::now() + timeout;
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) != 1) continue;
    char buf[256];
    closed = ::recv(fd, buf, sizeof buf, 0) <= 0;
  }
  ::close(fd);
  return closed;
}

}  // namespace troupe::test
