#pragma once
// Helpers of the multi-process node tests: a pipe that hands rank 0's ephemeral port to forked
// children, and the options of a test node. Every wait is bounded.

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>

#include "troupe/actors/node.hpp"
#include "troupe/tensors/error.hpp"

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

}  // namespace troupe::test
