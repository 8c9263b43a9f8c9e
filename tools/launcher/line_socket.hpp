#pragma once
// Lines of text over TCP sockets: the transport under the launcher channel (Note [launcher
// channel] in launcher/channel.hpp). A line is one message; a newline inside it becomes a space.

#include <netinet/in.h>

#include <optional>
#include <string>

namespace troupe::launcher {

/// Sends `line` and a newline. A full socket (the non-blocking end of a TLS relay) is waited on
/// for at most 1 s. A peer that is gone is left to the reader to notice; this never throws.
void send_line(int fd, std::string line);
/// True when `received` starts with a TLS record: a handshake (0x16) or an alert (0x15).
bool looks_like_tls(const std::string& received);
/// Appends what `fd` holds to `buf` without blocking. False once the connection is closed.
bool read_some(std::string& buf, int fd);
/// Removes the first complete line from `buf` and returns it without its newline; nullopt when
/// `buf` holds no complete line.
std::optional<std::string> take_line(std::string& buf);
/// The IPv4 address of `host` (an address, a resolvable name or a wildcard) with `port`.
/// Throws bad_argument when `host` is neither.
sockaddr_in ipv4(const std::string& host, int port);
/// A listening socket on `addr`:`port`. Throws io_error naming the address and the system's reason.
int listen_on(const std::string& addr, int port);
/// One connection attempt to `a`: the connected socket, or -1.
int connect_once(const sockaddr_in& a);

}  // namespace troupe::launcher
