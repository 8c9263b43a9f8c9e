#pragma once
// One outgoing TCP connection, bounded in time (the direct channel and the CAF port's gate).

#include <chrono>
#include <cstdint>
#include <string>

namespace troupe::detail {

/// A connected socket to host:port (IPv4), non-blocking and close-on-exec, or -1 when the name
/// does not resolve, the connect fails, or `timeout` passes first. Blocks up to `timeout`.
int dial_tcp(const std::string& host, std::uint16_t port, std::chrono::milliseconds timeout);

}  // namespace troupe::detail
