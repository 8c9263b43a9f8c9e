#include "troupe/actors/host_address.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "troupe/tensors/error.hpp"

namespace troupe {

namespace {
in_addr resolve(const std::string& host) {
  in_addr a{};
  if (::inet_pton(AF_INET, host.c_str(), &a) == 1) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res)
    throw error(errc::bad_argument, "'" + host + "' is neither an IPv4 address nor a resolvable host name");
  a = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return a;
}
}  // namespace

std::string peer_address(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || a.sin_family != AF_INET) return "an unknown address";
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &a.sin_addr, text, sizeof text);
  return std::string(text) + ":" + std::to_string(ntohs(a.sin_port));
}

std::string routable_address(const std::string& host) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(9);  // any port: a UDP connect only picks the route
  to.sin_addr = resolve(host);
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in me{};
  socklen_t len = sizeof me;
  if (fd < 0 || ::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof to) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw error(errc::io_error, "no route to '" + host + "': " + why);
  }
  ::close(fd);
  char buf[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &me.sin_addr, buf, sizeof buf);
  return buf;
}

bool is_loopback_address(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0; }

bool is_wildcard_address(const std::string& host) { return host.empty() || host == "0.0.0.0"; }

std::string advertised_address(const std::string& listen_addr, const std::string& master_addr) {
  return is_wildcard_address(listen_addr) ? routable_address(master_addr) : listen_addr;
}

std::string first_slurm_host(const std::string& nodelist) {
  // The first entry ends at the first comma outside brackets.
  std::size_t end = 0;
  for (int depth = 0; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']') --depth;
    if (nodelist[end] == ',' && depth == 0) break;
  }
  const std::string first = nodelist.substr(0, end);
  const auto open = first.find('[');
  if (first.empty() || open == 0) throw error(errc::bad_argument, "SLURM_JOB_NODELIST='" + nodelist + "' names no host");
  if (open == std::string::npos) return first;
  const auto close = first.find(']', open);
  if (close == std::string::npos) throw error(errc::bad_argument, "SLURM_JOB_NODELIST='" + nodelist + "' has an unclosed '['");
  const std::string range = first.substr(open + 1, close - open - 1);
  const std::string lo = range.substr(0, range.find_first_of(",-"));
  if (lo.empty()) throw error(errc::bad_argument, "SLURM_JOB_NODELIST='" + nodelist + "' has an empty range");
  return first.substr(0, open) + lo + first.substr(close + 1);
}

}  // namespace troupe
