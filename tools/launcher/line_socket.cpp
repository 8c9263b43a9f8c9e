#include "launcher/line_socket.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "troupe/actors/host_address.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::launcher {

void send_line(int fd, std::string line) {
  std::replace(line.begin(), line.end(), '\n', ' ');
  line += '\n';
  for (std::size_t off = 0; off < line.size();) {
    const auto n = ::send(fd, line.data() + off, line.size() - off, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, 1000) == 1) continue;
    }
    if (n <= 0) return;  // the peer is gone: its loss is seen by the reader
    off += static_cast<std::size_t>(n);
  }
}

bool looks_like_tls(const std::string& received) {
  return !received.empty() && (received[0] == '\x16' || received[0] == '\x15');
}

bool read_some(std::string& buf, int fd) {
  char tmp[4096];
  const auto n = ::recv(fd, tmp, sizeof tmp, MSG_DONTWAIT);
  if (n > 0) buf.append(tmp, static_cast<std::size_t>(n));
  return n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR));
}

std::optional<std::string> take_line(std::string& buf) {
  const auto nl = buf.find('\n');
  if (nl == std::string::npos) return std::nullopt;
  std::string line = buf.substr(0, nl);
  buf.erase(0, nl + 1);
  return line;
}

sockaddr_in ipv4(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (is_wildcard_address(host)) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res)
    throw error(errc::bad_argument, "'" + host + "' is neither an IPv4 address nor a resolvable host name");
  a.sin_addr = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return a;
}

int listen_on(const std::string& addr, int port) {
  const sockaddr_in a = ipv4(addr, port);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (fd >= 0) ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 64) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw error(errc::io_error, "cannot listen for the other launchers on " + addr + ":" + std::to_string(port) + ": " + why);
  }
  return fd;
}

int connect_once(const sockaddr_in& a) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0) return fd;
  if (fd >= 0) ::close(fd);
  return -1;
}

}  // namespace troupe::launcher
