#pragma once
// The raw TCP roles of multihost_bench: a server on one namespace host, a client on the other
// measuring the 1-byte ping-pong and the one-way stream (the limits of the figures between hosts).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
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

/// Serves two connections on `port`: the first echoes single bytes until EOF (ping-pong), the
/// second reads an 8-byte length, then that many bytes, then answers one byte (stream).
inline int tcp_server(int port) {
  const int ls = ::socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  ::setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(ls, 4) != 0) return 1;
  for (int conn = 0; conn < 2; ++conn) {
    const int fd = ::accept(ls, nullptr, nullptr);
    if (fd < 0) return 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (conn == 0) {
      char b = 0;
      while (read_full(fd, &b, 1) && write_full(fd, &b, 1)) {
      }
    } else {
      std::uint64_t left = 0;
      read_full(fd, &left, sizeof left);
      std::vector<char> buf(1 << 20);
      while (left > 0) {
        const auto r = ::read(fd, buf.data(), std::min<std::uint64_t>(left, buf.size()));
        if (r <= 0) break;
        left -= static_cast<std::uint64_t>(r);
      }
      write_full(fd, "k", 1);
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

/// Measures the ping-pong (`iters` round trips) and the stream (`bytes`) to tcp_server.
inline int tcp_client(const std::string& host, int port, int iters, std::uint64_t bytes) {
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
  std::vector<char> buf(std::size_t{4} << 20, 'y');
  const auto t0 = clock::now();
  write_full(st, &bytes, sizeof bytes);
  for (std::uint64_t sent = 0; sent < bytes; sent += buf.size()) write_full(st, buf.data(), std::min<std::uint64_t>(buf.size(), bytes - sent));
  read_full(st, &b, 1);
  const double s = seconds_since(t0);
  ::close(st);
  emit("mh_limit_tcp_stream_gbps", static_cast<double>(bytes) / s / 1e9, "GB/s", "\"bytes\": " + std::to_string(bytes));
  return 0;
}

}  // namespace troupe::bench::mh
