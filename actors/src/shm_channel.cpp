// Shared tensors over a Unix SOCK_SEQPACKET socket. One message is a tag byte and the
// CAF-serialised shared_tensor_meta. For the file_descriptor strategy, the segment's fd follows
// as SCM_RIGHTS.

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/binary_serializer.hpp>
#include <cerrno>
#include <cstring>
#include <vector>

#include "bounded_deserializer.hpp"
#include "troupe/actors/shared_memory.hpp"

namespace troupe {

namespace {

constexpr char message_tag = 'T';  // bumped if the message layout ever changes
constexpr std::size_t max_message = 64 * 1024;

std::string errno_text(const char* call) {
  const int e = errno;
  return std::string(call) + ": " + std::strerror(e);
}

// Waits until `fd` is ready for `events`; false on timeout.
bool wait_ready(int fd, short events, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd pfd{fd, events, 0};
    const int r = ::poll(&pfd, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0)));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return true;  // let the following call report the error
  }
}

std::vector<char> encode(shared_tensor_meta meta) {
  std::vector<char> buf{message_tag};
  caf::binary_serializer sink{nullptr, buf};
  if (auto err = sink(meta))
    throw error(errc::protocol_violation, "send_tensor_fd: cannot serialise the tensor meta");
  return buf;
}

shared_tensor_meta decode(const char* data, std::size_t n) {
  if (n < 1 || data[0] != message_tag)
    throw error(errc::protocol_violation, "recv_tensor_fd: message of " + std::to_string(n) + " bytes is not a tensor message");
  shared_tensor_meta meta;
  detail::bounded_deserializer source{nullptr, data + 1, n - 1};  // Note [bounded CAF reader]
  if (auto err = source(meta); err || source.remaining() != 0)
    throw error(errc::protocol_violation, "recv_tensor_fd: malformed tensor meta (" + std::to_string(n) + " bytes" +
                                              (source.violation().empty() ? std::string() : ": " + source.violation()) + ")");
  return meta;
}

// Reads one message and the fd it may carry (owned by the result).
std::pair<std::vector<char>, unique_fd> recv_message(int socket) {
  std::vector<char> buf(max_message);
  iovec iov{buf.data(), buf.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n = 0;
  while ((n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT)) < 0 && errno == EINTR) {
  }
  if (n < 0) throw error(errc::io_error, "recv_tensor_fd: " + errno_text("recvmsg"));
  if (n == 0) throw error(errc::io_error, "recv_tensor_fd: the peer closed the socket");
  unique_fd fd;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      int received = -1;
      std::memcpy(&received, CMSG_DATA(c), sizeof received);
      fd.reset(received);
    }
  }
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
    throw error(errc::protocol_violation, "recv_tensor_fd: truncated message");
  buf.resize(static_cast<std::size_t>(n));
  return {std::move(buf), std::move(fd)};
}

}  // namespace

void send_tensor_fd(int socket, const tensor& t, std::chrono::milliseconds timeout) {
  const shared_tensor_meta meta = describe_shared(t);
  const std::vector<char> buf = encode(meta);
  iovec iov{const_cast<char*>(buf.data()), buf.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (meta.storage.strategy == sharing_strategy::file_descriptor) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &meta.storage.fd, sizeof(int));
  }
  for (;;) {
    if (::sendmsg(socket, &msg, MSG_NOSIGNAL | MSG_DONTWAIT) >= 0) return;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
      throw error(errc::io_error, "send_tensor_fd(segment '" + meta.storage.name + "'): " + errno_text("sendmsg"));
    if (!wait_ready(socket, POLLOUT, timeout))
      throw error(errc::timeout, "send_tensor_fd(segment '" + meta.storage.name + "'): socket full for " +
                                     std::to_string(timeout.count()) + " ms");
  }
}

tensor recv_tensor_fd(int socket, std::chrono::milliseconds timeout) {
  if (!wait_ready(socket, POLLIN, timeout))
    throw error(errc::timeout, "recv_tensor_fd: no tensor within " + std::to_string(timeout.count()) + " ms");
  auto [buf, fd] = recv_message(socket);
  shared_tensor_meta meta = decode(buf.data(), buf.size());
  if (meta.storage.strategy == sharing_strategy::file_descriptor) {
    if (!fd)
      throw error(errc::protocol_violation, "recv_tensor_fd: file_descriptor tensor '" + meta.storage.name + "' came without its fd");
    meta.storage.fd = fd.get();  // tensor_from_shared_handle dups it; ours closes on return
  }
  return tensor_from_shared_meta(meta);
}

std::pair<shm_channel, shm_channel> shm_channel::make_pair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    throw error(errc::io_error, "shm_channel::make_pair: " + errno_text("socketpair"));
  return {shm_channel(unique_fd(sv[0])), shm_channel(unique_fd(sv[1]))};
}

}  // namespace troupe
