#pragma once
// Reads exactly n bytes from a socket, for the tests that parse frames off a socket pair.

#include <sys/socket.h>
#include <sys/types.h>

#include <cstddef>

namespace troupe::test {

/// Reads `n` bytes into `p`; false on EOF or an error before all arrived.
inline bool read_exact(int fd, char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

}  // namespace troupe::test
