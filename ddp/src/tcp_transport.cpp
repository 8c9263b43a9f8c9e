// The TCP transport of the CPU process group: rendezvous, hello, framed reads and writes with
// deadlines, the sender thread. See Note [tcp ring].
#include "tcp_transport.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

namespace troupe::ddp::detail {

namespace {

/// Opens the reason of an abort frame that carries a collective mismatch (a rank left).
const std::string mismatch_mark = "[collective_mismatch] ";

using clock = std::chrono::steady_clock;
constexpr std::uint32_t hello_magic = 0x54525048;  // "TRPH"
constexpr int slice_ms = 20;                        // poll slice: bounds the reaction to an abort

struct hello {
  std::uint32_t magic = hello_magic;
  std::uint32_t kind = 0;  // 1 ring, 2 p2p
  std::int32_t rank = -1;
  std::int32_t pad = 0;
  std::uint64_t nonce = 0;
  char name[72] = {};
};

int ms_until(clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
  return static_cast<int>(std::max<long long>(0, std::min<long long>(left, slice_ms)));
}

void tune(int fd) {
  const int one = 1, big = 8 << 20;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
}

sockaddr_in parse_addr(const std::string& host, int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &found) != 0 || found == nullptr)
    throw error(errc::bad_argument, "process_group: tcp_address '" + host + "' is neither an IPv4 address nor a resolvable host name");
  a.sin_addr = reinterpret_cast<const sockaddr_in*>(found->ai_addr)->sin_addr;
  ::freeaddrinfo(found);
  return a;
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

}  // namespace


transport_kind choose_transport(const rendezvous& store, int rank, int world, const std::string& name,
                                transport_kind requested, std::chrono::milliseconds timeout) {
  if (requested != transport_kind::automatic) return requested;
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  const std::string id = std::string(host) + " " + read_first_line("/proc/sys/kernel/random/boot_id");
  const std::string prefix = "troupe/pg/" + name + "/host/";
  store.set(prefix + std::to_string(rank), id);
  for (int r = 0; r < world; ++r)
    if (store.get(prefix + std::to_string(r), timeout) != id) return transport_kind::tcp;
  return transport_kind::shared_memory;
}

tcp_transport::tcp_transport(const rendezvous& store, int rank, int world, const std::string& name,
                             const process_group_options& opts)
    : rank_(rank), world_(world), name_(name), chunk_bytes_(opts.tcp_chunk_bytes), timeout_(opts.timeout) {
  if (world < 1 || world > max_ranks || rank < 0 || rank >= world)
    throw error(errc::bad_argument, label() + ": rank " + std::to_string(rank) + " / world size " +
                                        std::to_string(world) + " out of range (world 1.." + std::to_string(max_ranks) + ")");
  if (name.empty() || name.size() > 64)
    throw error(errc::bad_argument, "process_group: the group name must be 1-64 characters, got '" + name + "'");
  if (chunk_bytes_ < 4096 || chunk_bytes_ % 64 != 0)
    throw error(errc::bad_argument, label() + ": tcp_chunk_bytes must be a multiple of 64, >= 4096");
  tls_ = make_tls_context(opts.tls);  // bad_argument / io_error naming a file: before any rendezvous
  sockaddr_in a = parse_addr(opts.tcp_address, 0);
  if (a.sin_addr.s_addr == htonl(INADDR_ANY))
    throw error(errc::bad_argument, label() + ": tcp_address " + opts.tcp_address +
                                        " cannot be published to the peers: give this rank's interface address");
  listener_ = tcp_socket(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  socklen_t len = sizeof(a);
  if (!listener_ || ::bind(listener_.fd(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(listener_.fd(), 128) != 0 || ::getsockname(listener_.fd(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw error(errc::io_error, label() + ": cannot listen on " + opts.tcp_address + ": " + std::strerror(errno));
  ::fcntl(listener_.fd(), F_SETFL, ::fcntl(listener_.fd(), F_GETFL) | O_NONBLOCK);
  std::random_device rd;
  const std::uint64_t mine = (std::uint64_t{rd()} << 32) ^ rd();
  const std::string prefix = "troupe/pg/" + name_ + "/tcp/";
  store.set(prefix + std::to_string(rank),
            opts.tcp_address + " " + std::to_string(ntohs(a.sin_port)) + " " + std::to_string(mine));
  addrs_.resize(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    std::istringstream in(store.get(prefix + std::to_string(r), timeout_));
    std::uint64_t n = 0;
    in >> addrs_[r].host >> addrs_[r].port >> n;
    if (r == 0) nonce_ = n;
  }
  p2p_out_.resize(static_cast<std::size_t>(world));
  p2p_in_.resize(static_cast<std::size_t>(world));
  p2p_last_out_.resize(static_cast<std::size_t>(world));
  p2p_seq_in_.assign(static_cast<std::size_t>(world), 0);
  if (world == 1) return;
  begin(lane::collectives, "rendezvous");
  const lane_operation& ring = op(lane::collectives);
  if (tls_) {  // Note [tcp ring]: the sender runs the client handshake while this rank accepts
    std::vector<std::byte> hello_bytes;
    ring_out_ = connect_to(ring, next(), 1, &hello_bytes);
    sender_ = std::make_unique<tcp_sender>(ring_out_, "rank " + std::to_string(next()));
    sender_->push_raw(hello_bytes.data(), hello_bytes.size());
    ring_in_ = take_incoming(ring, 1, prev());
    sender_->flush(ring.deadline, ring.what);
    return;
  }
  ring_out_ = connect_to(ring, next(), 1);
  ring_in_ = take_incoming(ring, 1, prev());
  sender_ = std::make_unique<tcp_sender>(ring_out_, "rank " + std::to_string(next()));
}

tcp_transport::~tcp_transport() {
  if (sender_ && world_ > 1 && !aborted_.load(std::memory_order_acquire)) {
    // A clean leave (Note [tcp ring]): next() learns which collective this rank entered last.
    sender_->push(frame_type::leave, reinterpret_cast<const std::byte*>(&last_fp_), sizeof(last_fp_), true);
    try {
      sender_->flush(clock::now() + std::chrono::seconds(1), "leave");
    } catch (const error&) {  // next() is gone already: nobody to tell
    }
  }
  sender_.reset();  // joins the sender thread before its socket closes
}

std::string tcp_transport::label() const { return "process_group '" + name_ + "' (tcp)"; }

void tcp_transport::begin(lane l, std::string what) {
  auto& o = op(l);
  o.what = std::move(what);
  o.deadline = clock::now() + timeout_;
}

tcp_socket tcp_transport::connect_to(const lane_operation& op, int peer, std::uint32_t kind, std::vector<std::byte>* hello_out) {
  sockaddr_in a = parse_addr(addrs_[peer].host, addrs_[peer].port);
  tcp_socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) throw error(errc::io_error, label() + ": socket(): " + std::strerror(errno));
  tune(s.fd());
  if (::connect(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 && errno != EINPROGRESS)
    throw error(errc::peer_lost, label() + ": cannot connect to rank " + std::to_string(peer) + " at " +
                                     addrs_[peer].host + ":" + std::to_string(addrs_[peer].port) + ": " + std::strerror(errno));
  hello h;
  h.kind = kind;
  h.rank = rank_;
  h.nonce = nonce_;
  std::strncpy(h.name, name_.c_str(), sizeof(h.name) - 1);
  if (tls_) s.start_tls(tls_, tls_session::role::client);
  const auto* bytes = reinterpret_cast<const std::byte*>(&h);
  if (hello_out != nullptr)
    hello_out->assign(bytes, bytes + sizeof(h));
  else
    write_exact(op, s, peer, bytes, sizeof(h));
  return s;
}

bool tcp_transport::accept_one(const lane_operation& op) {
  pollfd p{listener_.fd(), POLLIN, 0};
  if (::poll(&p, 1, ms_until(op.deadline)) != 1) return false;
  tcp_socket s(::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!s) return false;
  tune(s.fd());
  // A bounded wait: a client that connects and says nothing cannot hold the group up long.
  const lane_operation hello_op{op.what, std::min(op.deadline, clock::now() + std::chrono::seconds(2)), {}};
  if (tls_) {
    s.start_tls(tls_, tls_session::role::server);
    try {
      s.tls()->handshake(hello_op.deadline);
    } catch (const error& e) {
      std::fprintf(stderr, "troupe: %s rank %d: refused a connection: %s\n", label().c_str(), rank_, e.what());
      return false;
    }
  }
  hello h;
  try {
    read_exact(hello_op, s, -1, reinterpret_cast<std::byte*>(&h), sizeof(h));
  } catch (const error& e) {
    std::fprintf(stderr, "troupe: %s rank %d: refused a connection without a hello: %s\n", label().c_str(), rank_, e.what());
    return false;
  }
  h.name[sizeof(h.name) - 1] = '\0';
  if (h.magic != hello_magic || h.nonce != nonce_ || name_ != h.name || h.rank < 0 || h.rank >= world_ ||
      h.rank == rank_ || (h.kind != 1 && h.kind != 2)) {
    std::fprintf(stderr, "troupe: %s rank %d: refused a connection with a wrong hello (group '%s', rank %d, kind %u)\n",
                 label().c_str(), rank_, h.name, h.rank, h.kind);
    return false;
  }
  pending_[{h.kind, h.rank}] = std::move(s);
  return true;
}

tcp_socket tcp_transport::take_incoming(const lane_operation& op, std::uint32_t kind, int peer) {
  std::lock_guard<std::mutex> lock(accept_mu_);
  for (;;) {
    auto it = pending_.find({kind, peer});
    if (it != pending_.end()) {
      tcp_socket s = std::move(it->second);
      pending_.erase(it);
      return s;
    }
    check_failed(op);
    if (clock::now() >= op.deadline) fail_timeout(op, peer);
    accept_one(op);
  }
}

void tcp_transport::check_failed(const lane_operation& op) {
  if (!aborted_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(abort_mu_);
  throw error(errc::peer_lost, label() + " rank " + std::to_string(rank_) + ": during " + op.what +
                                   ": the group failed: " + abort_reason_);
}

void tcp_transport::fail_timeout(const lane_operation& op, int peer) {
  throw error(errc::timeout, label() + ": " + op.what + " timed out after " + std::to_string(timeout_.count()) +
                                 " ms waiting for rank " + std::to_string(peer));
}

void tcp_transport::read_exact(const lane_operation& op, tcp_socket& fd, int peer, std::byte* p, std::size_t n) {
  while (n > 0) {
    const ssize_t got = fd.recv_some(p, n);
    if (got > 0) {
      p += got;
      n -= static_cast<std::size_t>(got);
      continue;
    }
    const int e = got == 0 ? 0 : errno;
    if (got < 0 && (e == EAGAIN || e == EINTR)) {
      if (peer >= 0) check_failed(op);
      if (clock::now() >= op.deadline) {
        if (peer < 0) throw error(errc::timeout, "no data before the deadline");
        fail_timeout(op, peer);
      }
      pollfd pf{fd.fd(), fd.wants(POLLIN), 0};
      ::poll(&pf, 1, ms_until(op.deadline));
      continue;
    }
    if (peer >= 0) check_failed(op);  // our own abort shut this socket: report the first failure
    throw error(errc::peer_lost, label() + ": rank " + std::to_string(peer) + (got == 0 ? " closed its connection" : " reset its connection (") +
                                     (got == 0 ? "" : fd.error_text(e) + ")") + " during " + op.what +
                                     " (it exited or was killed)");
  }
}

void tcp_transport::write_exact(const lane_operation& op, tcp_socket& fd, int peer, const std::byte* p, std::size_t n) {
  while (n > 0) {
    const ssize_t put = fd.send_some(p, n);
    if (put > 0) {
      p += put;
      n -= static_cast<std::size_t>(put);
      continue;
    }
    if (put < 0 && (errno == EAGAIN || errno == EINTR || errno == EINPROGRESS)) {
      check_failed(op);
      if (clock::now() >= op.deadline) fail_timeout(op, peer);
      pollfd pf{fd.fd(), fd.wants(POLLOUT), 0};
      ::poll(&pf, 1, ms_until(op.deadline));
      continue;
    }
    throw error(errc::peer_lost, label() + ": rank " + std::to_string(peer) + " is unreachable during " + op.what + ": " +
                                     fd.error_text(errno) + " (it exited or was killed)");
  }
}

frame_header tcp_transport::read_header(const lane_operation& op, tcp_socket& fd, int peer) {
  frame_header h;
  read_exact(op, fd, peer, reinterpret_cast<std::byte*>(&h), sizeof(h));
  if (static_cast<frame_type>(h.type) == frame_type::leave) {
    fingerprint last;
    read_exact(op, fd, peer, reinterpret_cast<std::byte*>(&last), sizeof(last));
    const std::string after = last.seq == 0 ? "before entering any collective"
                                            : "after collective #" + std::to_string(last.seq) + " (" + describe(last) + ")";
    const std::string msg = label() + ": rank " + std::to_string(peer) + " left the group " + after + " while rank " +
                            std::to_string(rank_) + " waits for it in " + op.what +
                            ": the ranks issued different numbers of collectives (did a rank skip one?)";
    abort(mismatch_mark + msg);  // the ranks further round fail alike
    throw error(errc::collective_mismatch, msg);
  }
  if (static_cast<frame_type>(h.type) == frame_type::abort) {
    std::string reason(std::min<std::uint64_t>(h.length, 4096), '\0');
    read_exact(op, fd, peer, reinterpret_cast<std::byte*>(reason.data()), reason.size());
    const bool mismatch = reason.rfind(mismatch_mark, 0) == 0;
    if (mismatch) abort(reason);  // pass it on: a mismatch does not break the group on its own
    throw error(mismatch ? errc::collective_mismatch : errc::peer_lost,
                label() + " rank " + std::to_string(rank_) + ": during " + op.what + ", rank " + std::to_string(peer) +
                    " aborted: " + (mismatch ? reason.substr(mismatch_mark.size()) : reason));
  }
  return h;
}

void tcp_transport::check_sender(const lane_operation& op) {
  auto e = sender_->error();
  if (!e) return;
  // next() is gone. That may be the echo of an earlier failure. Then prev() is about to pass on
  // an abort frame naming the first one: read ahead briefly (dropping data) and raise that.
  const lane_operation grace{op.what, clock::now() + std::chrono::milliseconds(300), {}};
  std::vector<std::byte> sink(64 << 10);
  try {
    for (;;) {
      const frame_header h = read_header(grace, ring_in_, prev());  // throws on an abort frame
      for (std::uint64_t left = h.length; left > 0;) {
        const std::size_t m = static_cast<std::size_t>(std::min<std::uint64_t>(left, sink.size()));
        read_exact(grace, ring_in_, prev(), sink.data(), m);
        left -= m;
      }
    }
  } catch (const error& abort_frame) {
    if (abort_frame.code() == errc::collective_mismatch) throw;  // a leave, or a mismatch passed on
    if (abort_frame.code() == errc::peer_lost && abort_frame.message().find(" aborted: ") != std::string::npos) throw;
  }
  throw *e;
}

void tcp_transport::send_next(const std::byte* p, std::size_t n) {
  check_sender(op(lane::collectives));
  sender_->push(frame_type::data, p, n);
}

void tcp_transport::recv_prev(std::byte* p, std::size_t n) {
  const lane_operation& ring = op(lane::collectives);
  check_sender(ring);
  const frame_header h = read_header(ring, ring_in_, prev());
  if (static_cast<frame_type>(h.type) != frame_type::data || h.length != n)
    throw error(errc::invalid_state, label() + ": protocol error during " + ring.what + ": expected " + std::to_string(n) +
                                         " data bytes from rank " + std::to_string(prev()) + ", got frame type " +
                                         std::to_string(h.type) + " of " + std::to_string(h.length) + " bytes");
  read_exact(ring, ring_in_, prev(), p, n);
}

void tcp_transport::flush() {
  if (!sender_) return;
  const lane_operation& ring = op(lane::collectives);
  // In slices, so a member the node declared lost (Note [group peer loss]) ends the wait.
  for (;;) {
    check_failed(ring);
    if (sender_->flush_until(std::min(ring.deadline, clock::now() + std::chrono::milliseconds(slice_ms)))) return;
    if (clock::now() >= ring.deadline) return sender_->flush(ring.deadline, ring.what);
  }
}

void tcp_transport::abort(const std::string& reason) noexcept {
  std::string first;
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (told_next_) return;
    told_next_ = true;
    if (!aborted_.load()) abort_reason_ = reason;
    first = abort_reason_;
  }
  aborted_.store(true, std::memory_order_release);
  // Only the outgoing side closes, after the abort frame. So prev() learns of the failure from
  // the frames coming around the ring. A reset would hide the first failure's name.
  if (sender_) sender_->abort(first);
}

void tcp_transport::mark_broken(const std::string& reason) noexcept {
  std::lock_guard<std::mutex> lock(abort_mu_);
  if (aborted_.load()) return;
  abort_reason_ = reason;
  aborted_.store(true, std::memory_order_release);
}

std::vector<fingerprint> tcp_transport::gather_fingerprints(const fingerprint& f) {
  std::vector<fingerprint> all(static_cast<std::size_t>(world_));
  all[rank_] = f;
  last_fp_ = f;
  if (world_ == 1) return all;
  const lane_operation& ring = op(lane::collectives);
  sender_->push(frame_type::fingerprint, reinterpret_cast<const std::byte*>(&f), sizeof(f), true);
  for (int s = 0; s < world_ - 1; ++s) {
    const int k = ((rank_ - s - 1) % world_ + world_) % world_;  // rank k's entry arrives at step s
    check_sender(ring);
    frame_header h;
    try {
      h = read_header(ring, ring_in_, prev());
    } catch (const error& e) {
      // Ranks k+1 .. r-1 entered and forward what they get, so rank k has not entered.
      if (e.code() != errc::timeout) throw;
      throw error(errc::timeout, label() + ": " + ring.what + ": rank " + std::to_string(k) +
                                     " did not arrive before the deadline (ranks further up the ring are unknown)");
    }
    if (static_cast<frame_type>(h.type) != frame_type::fingerprint || h.length != sizeof(fingerprint))
      throw error(errc::invalid_state, label() + ": protocol error during " + ring.what + ": expected a fingerprint from rank " +
                                           std::to_string(prev()));
    read_exact(ring, ring_in_, prev(), reinterpret_cast<std::byte*>(&all[k]), sizeof(fingerprint));
    if (static_cast<std::int32_t>(all[k].seq - f.seq) < 0) {  // a late repeat (Note [collective payload faults])
      ++repeats_;
      --s;
      continue;
    }
    if (s < world_ - 2) sender_->push(frame_type::fingerprint, reinterpret_cast<const std::byte*>(&all[k]), sizeof(f), true);
  }
  return all;
}

void tcp_transport::enter(const fingerprint& f) {
  const std::vector<fingerprint> all = gather_fingerprints(f);
  for (int r = 1; r < world_; ++r) {
    const auto& a = all[0];
    const auto& b = all[r];
    if (a.seq == b.seq && a.kind == b.kind && a.op == b.op && a.dtype == b.dtype && a.numel == b.numel && a.root == b.root)
      continue;
    throw error(errc::collective_mismatch, label() + ": collective #" + std::to_string(f.seq) +
                                               " differs across ranks: rank 0 called " + describe(a) + ", rank " +
                                               std::to_string(r) + " called " + describe(b));
  }
}

void tcp_transport::enter_monitored(const fingerprint& f, std::chrono::milliseconds timeout) {
  op(lane::collectives).deadline = std::chrono::steady_clock::now() + timeout;
  try {
    gather_fingerprints(f);
  } catch (const error& e) {
    if (e.code() != errc::timeout) throw;
    const error late(errc::timeout, e.message() + " (monitored barrier, " + std::to_string(timeout.count()) + " ms)");
    // Late entries would put the ring out of step: the group is broken here. The peers are not
    // told, so each one names the late rank from its own wait.
    mark_broken(late.message());
    throw late;
  }
}

void tcp_transport::p2p_send(int dst, const fingerprint& unnumbered, const std::byte* p, std::size_t n) {
  const lane_operation& send = op(lane::sends);
  if (!p2p_out_[dst]) p2p_out_[dst] = connect_to(send, dst, 2);
  tcp_socket& fd = p2p_out_[dst];
  fingerprint meta = unnumbered;
  meta.seq = p2p_last_out_[dst].seq + 1;  // the receiver drops repeats by it (Note [collective payload faults])
  p2p_last_out_[dst] = meta;
  frame_header h{static_cast<std::uint32_t>(frame_type::p2p_meta), 0, sizeof(meta)};
  write_exact(send, fd, dst, reinterpret_cast<const std::byte*>(&h), sizeof(h));
  write_exact(send, fd, dst, reinterpret_cast<const std::byte*>(&meta), sizeof(meta));
  write_exact(send, fd, dst, p, n);
}

fingerprint tcp_transport::p2p_recv_meta(int src) {
  const lane_operation& recv = op(lane::receives);
  if (!p2p_in_[src]) p2p_in_[src] = take_incoming(recv, 2, src);
  for (;;) {
    const frame_header h = read_header(recv, p2p_in_[src], src);
    fingerprint meta;
    if (static_cast<frame_type>(h.type) != frame_type::p2p_meta || h.length != sizeof(meta))
      throw error(errc::invalid_state, label() + ": protocol error receiving from rank " + std::to_string(src));
    read_exact(recv, p2p_in_[src], src, reinterpret_cast<std::byte*>(&meta), sizeof(meta));
    if (static_cast<std::int32_t>(meta.seq - p2p_seq_in_[src]) > 0) {
      p2p_seq_in_[src] = meta.seq;
      return meta;
    }
    // A number taken already: a repeat (Note [collective payload faults]); drop it with its data.
    p2p_recv_data(src, nullptr, static_cast<std::size_t>(meta.numel) * troupe::element_size(static_cast<troupe::dtype>(meta.dtype)));
    ++repeats_;
  }
}

void tcp_transport::p2p_abort(int dst, const std::string& reason) noexcept {
  try {
    const lane_operation& send = op(lane::sends);
    if (!p2p_out_[dst]) p2p_out_[dst] = connect_to(send, dst, 2);
    const frame_header h{static_cast<std::uint32_t>(frame_type::abort), 0, reason.size()};
    write_exact(send, p2p_out_[dst], dst, reinterpret_cast<const std::byte*>(&h), sizeof(h));
    write_exact(send, p2p_out_[dst], dst, reinterpret_cast<const std::byte*>(reason.data()), reason.size());
  } catch (const std::exception&) {
    // The receiver fails at its own deadline instead.
  }
}

void tcp_transport::repeat_entry() {
  if (world_ > 1) sender_->push(frame_type::fingerprint, reinterpret_cast<const std::byte*>(&last_fp_), sizeof(last_fp_), true);
}

void tcp_transport::repeat_send(int dst, const std::byte* p, std::size_t n) {
  // p2p_send numbers a message one past the last one to `dst`: step back to send that number again.
  const fingerprint last = p2p_last_out_[dst];
  --p2p_last_out_[dst].seq;
  p2p_send(dst, last, p, n);
}

void tcp_transport::p2p_recv_data(int src, std::byte* p, std::size_t n) {
  const lane_operation& recv = op(lane::receives);
  if (p != nullptr) return read_exact(recv, p2p_in_[src], src, p, n);
  std::vector<std::byte> sink(std::min<std::size_t>(n, std::size_t{1} << 20));
  for (std::size_t left = n; left > 0;) {
    const std::size_t m = std::min(left, sink.size());
    read_exact(recv, p2p_in_[src], src, sink.data(), m);
    left -= m;
  }
}

}  // namespace troupe::ddp::detail
