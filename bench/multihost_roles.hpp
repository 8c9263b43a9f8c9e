#pragma once
// The raw TCP roles of multihost_bench: a server on one namespace host, and a client on the
// other. The client measures the limits of the figures between hosts:
//   - the 1-byte ping-pong;
//   - the one-way stream;
//   - a 64 MB echo: the whole message there, then the whole message back, as an rpc echo of a
//     tensor must do;
//   - a full-duplex stream: both directions at once, as a ring allreduce does.
//
// Note [limits on one machine]
// The namespace hosts share the machine's cores. Every byte between them is copied by the
// sender's and the receiver's kernel, on those same cores. Traffic in both directions at once
// (the ring's) cannot reach the one-way stream rate when the cores are the bottleneck. Nor can
// a request and its reply (the echo's, counted once). Between real hosts each has its own
// cores. The echo and the duplex limits are the like-for-like bounds of
// mh_tensor_echo_64mb_gbps and mh_allreduce_busbw_100mb_2h_gbps. For busbw, each rank sends
// and receives that many bytes per second.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <thread>
#include <string>
#include <vector>

#include "bench_util.hpp"

namespace troupe::bench::mh {

inline bool read_full(int fd, void* p, std::size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    const auto r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

inline bool write_full(int fd, const void* p, std::size_t n) {
  const auto* c = static_cast<const char*>(p);
  while (n > 0) {
    const auto r = ::send(fd, c, n, MSG_NOSIGNAL);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

/// Prints one metric for the orchestrator: "M <metric> <value> <unit> <params>".
inline void emit(const std::string& metric, double value, const std::string& unit, const std::string& params = "") {
  std::printf("M %s %.6g %s %s\n", metric.c_str(), value, unit.c_str(), params.c_str());
  std::fflush(stdout);
}

/// Reads `n` bytes into `buf` (reused, at most its size at a time) and drops them.
inline bool drain(int fd, std::vector<char>& buf, std::uint64_t n) {
  while (n > 0) {
    const auto r = ::read(fd, buf.data(), std::min<std::uint64_t>(n, buf.size()));
    if (r <= 0) return false;
    n -= static_cast<std::uint64_t>(r);
  }
  return true;
}

/// Writes `n` bytes from `buf` (reused) to `fd`.
inline bool pour(int fd, const std::vector<char>& buf, std::uint64_t n) {
  for (std::uint64_t sent = 0; sent < n; sent += buf.size())
    if (!write_full(fd, buf.data(), std::min<std::uint64_t>(buf.size(), n - sent))) return false;
  return true;
}

/// Serves four connections on `port`:
///   1. ping-pong: echoes single bytes until EOF;
///   2. stream: reads an 8-byte length, that many bytes, then answers one byte;
///   3. echo: reads an 8-byte length L and count R, then R times reads L bytes whole and writes
///      them back;
///   4. duplex: reads an 8-byte length L, then reads L bytes while writing L bytes, then answers
///      one byte.
inline int tcp_server(int port) {
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls, 4) != 0) return 1;
  std::vector<char> buf(1 << 20);
  for (int conn = 0; conn < 4; ++conn) {
    const int fd = ::accept(ls, nullptr, nullptr);
    if (fd < 0) return 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::uint64_t len = 0, reps = 0;
    if (conn == 0) {
      char b = 0;
      while (read_full(fd, &b, 1) && write_full(fd, &b, 1)) {
      }
    } else if (conn == 1) {
      if (read_full(fd, &len, sizeof len) && drain(fd, buf, len)) write_full(fd, "k", 1);
    } else if (conn == 2) {
      if (read_full(fd, &len, sizeof len) && read_full(fd, &reps, sizeof reps)) {
        std::vector<char> msg(len);
        for (std::uint64_t i = 0; i < reps && read_full(fd, msg.data(), len) && write_full(fd, msg.data(), len); ++i) {
        }
      }
    } else if (read_full(fd, &len, sizeof len)) {
      const std::vector<char> out(std::size_t{1} << 20, 'z');
      std::thread writer([&] { pour(fd, out, len); });
      const bool ok = drain(fd, buf, len);
      writer.join();
      if (ok) write_full(fd, "k", 1);
    }
    ::close(fd);
  }
  ::close(ls);
  return 0;
}

inline int connect_to(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  for (int attempt = 0; attempt < 200; ++attempt) {  // the server may not listen yet (bounded)
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return fd;
    }
    ::close(fd);
    ::usleep(20000);
  }
  return -1;
}

/// The echo limit: `reps` round trips of a `bytes` message sent whole and returned whole (conn 3).
inline bool tcp_echo(const std::string& host, int port, int reps, std::uint64_t bytes) {
  const int fd = connect_to(host, port);
  if (fd < 0) return false;
  std::vector<char> msg(bytes, 'e');
  const std::uint64_t count = static_cast<std::uint64_t>(reps) + 1;  // one warm-up
  write_full(fd, &bytes, sizeof bytes);
  write_full(fd, &count, sizeof count);
  const auto s = summarize(time_runs(1, reps, [&] {
    write_full(fd, msg.data(), bytes);
    read_full(fd, msg.data(), bytes);
  }));
  ::close(fd);
  emit("mh_limit_tcp_echo_64mb_gbps", static_cast<double>(bytes) / s.median / 1e9, "GB/s",
       "\"bytes\": " + std::to_string(bytes) + ", \"iters\": " + std::to_string(reps));
  return true;
}

/// The duplex limit: `bytes` each way at once (conn 4); the rate of one direction.
inline bool tcp_duplex(const std::string& host, int port, std::uint64_t bytes) {
  const int fd = connect_to(host, port);
  if (fd < 0) return false;
  const std::vector<char> out(std::size_t{1} << 20, 'd');
  std::vector<char> in(std::size_t{1} << 20);
  const auto t0 = clock::now();
  write_full(fd, &bytes, sizeof bytes);
  std::thread writer([&] { pour(fd, out, bytes); });
  const bool ok = drain(fd, in, bytes);
  writer.join();
  char b = 0;
  const bool done = ok && read_full(fd, &b, 1);
  const double s = seconds_since(t0);
  ::close(fd);
  if (done) emit("mh_limit_tcp_duplex_gbps", static_cast<double>(bytes) / s / 1e9, "GB/s", "\"bytes_each_way\": " + std::to_string(bytes));
  return done;
}

/// Measures the ping-pong (`iters` round trips), the stream (`bytes`), the echo of 64 MB
/// (`echo_reps` round trips) and the duplex stream (`bytes` / 2 each way) to tcp_server.
inline int tcp_client(const std::string& host, int port, int iters, std::uint64_t bytes, int echo_reps) {
  const int pp = connect_to(host, port);
  if (pp < 0) return 1;
  char b = 'x';
  const auto rtt = summarize(time_runs(iters / 10, iters, [&] {
    write_full(pp, &b, 1);
    read_full(pp, &b, 1);
  }));
  ::close(pp);
  emit("mh_limit_tcp_pingpong_median_us", rtt.median * 1e6, "us", "\"iters\": " + std::to_string(iters));
  const int st = connect_to(host, port);
  if (st < 0) return 1;
  const std::vector<char> buf(std::size_t{4} << 20, 'y');
  const auto t0 = clock::now();
  write_full(st, &bytes, sizeof bytes);
  pour(st, buf, bytes);
  read_full(st, &b, 1);
  const double s = seconds_since(t0);
  ::close(st);
  emit("mh_limit_tcp_stream_gbps", static_cast<double>(bytes) / s / 1e9, "GB/s", "\"bytes\": " + std::to_string(bytes));
  if (!tcp_echo(host, port, echo_reps, std::uint64_t{64} << 20)) return 1;
  return tcp_duplex(host, port, bytes / 2) ? 0 : 1;
}

}  // namespace troupe::bench::mh
