#pragma once
// The TCP transport of the CPU process group: the cross-host path. See Note [tcp ring].
//
// Note [tcp ring]
// ---------------
// Each rank listens on an ephemeral port of opts.tcp_address and publishes
// "troupe/pg/<name>/tcp/<rank>" = "<address> <port> <nonce>"; rank 0's random nonce is the
// group's. Rank r connects to r+1 (mod w), the ring, and accepts from r-1. Every connection
// starts with a hello {magic, kind (ring | p2p), rank, nonce, group name}. The listener closes
// and logs a connection whose hello is wrong, like the job token rule, and keeps accepting.
// The sockets carry frames {type, length, payload}; nothing else (no CAF, no control traffic).
//
//   rank r-1 --ring--> rank r --ring--> rank r+1        send_next: queued to a sender thread
//            frames: fingerprint | data | abort          recv_prev: read on the worker thread
//
// A collective first passes the fingerprints around the ring in w-1 hops. Every rank then holds
// all of them, compares the same set and raises the same collective_mismatch. Then the data
// follow in chunks of opts.tcp_chunk_bytes: allreduce = reduce-scatter + allgather. The chunk
// just reduced is queued to the sender thread at once, so sending chunk k overlaps receiving
// and reducing k+1.
// Failure:
//   - EOF / ECONNRESET on a ring socket -> peer_lost naming that neighbour, at once.
//   - A rank that fails sends an abort frame carrying its reason to r+1 before closing. So ranks
//     further on name the rank that died first.
//   - Every wait polls in short slices against the collective's deadline (-> timeout).
//   - A rank that destroys its group first sends a leave frame to r+1: the fingerprint it
//     entered last. A rank that reads it where it waits for a fingerprint or data fails with
//     collective_mismatch: the ranks issued different numbers of collectives. It passes the
//     failure on in an abort frame marked as a mismatch. So every rank fails alike, not at the
//     deadline.
// Send/recv use a separate connection per ordered pair, made lazily by the sender (hello kind
// p2p). Each message's meta carries its number on that connection, from 1. A receiver drops a
// number it has taken (Note [collective payload faults]). A sender whose payload the plan drops
// sends an abort frame there instead, so the recv fails at once.
// Reduction order: shard k is folded along the ring starting at the rank that holds it first.
// With 2 ranks the operands are put in rank order, so the bits equal the shared-memory path's.
// With more ranks float results may differ in the last bits.
// TLS (Note [tls] in troupe/actors/tls_context.hpp, opts.tls set): every connection is mutual
// TLS and the hello travels inside it. The listener runs the server handshake (2 s at most) in
// accept_one; a peer whose certificate does not verify is closed and logged like a wrong hello.
// The ring's client side sends its hello from the sender thread, so that the handshake with
// next() runs while this rank accepts prev()'s (every rank connects before it accepts).
// Assumes: collectives issued in the same order on every rank; ranks of one binary layout.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collectives.hpp"
#include "troupe/actors/tls_session.hpp"
#include "shm_transport.hpp"

namespace troupe::ddp::detail {

/// A socket file descriptor, closed on destruction, optionally carrying a TLS connection. Move-only.
class tcp_socket {
 public:
  tcp_socket() = default;
  explicit tcp_socket(int fd) noexcept : fd_(fd) {}
  ~tcp_socket();
  tcp_socket(tcp_socket&& o) noexcept : fd_(o.fd_), tls_(std::move(o.tls_)) { o.fd_ = -1; }
  tcp_socket& operator=(tcp_socket&& o) noexcept;
  tcp_socket(const tcp_socket&) = delete;
  tcp_socket& operator=(const tcp_socket&) = delete;
  int fd() const noexcept { return fd_; }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  /// Wraps the socket in TLS from now on (the handshake runs on the first read or write).
  void start_tls(std::shared_ptr<const tls_context> ctx, tls_session::role r);
  tls_session* tls() noexcept { return tls_.get(); }
  /// recv/send semantics (> 0, 0 closed, -1 with errno), through TLS when started.
  ssize_t recv_some(std::byte* p, std::size_t n);
  ssize_t send_some(const std::byte* p, std::size_t n);
  /// The poll events to wait for after EAGAIN, `natural` without TLS.
  short wants(short natural) const noexcept { return tls_ ? tls_->wants() : natural; }
  /// strerror(e), or the TLS failure for EPROTO.
  std::string error_text(int e) const;

 private:
  int fd_ = -1;
  std::unique_ptr<tls_session> tls_;
};

enum class frame_type : std::uint32_t { data = 1, fingerprint = 2, abort = 3, p2p_meta = 4, leave = 5 };

/// The wire header of a frame.
struct frame_header {
  std::uint32_t type = 0;
  std::uint32_t pad = 0;
  std::uint64_t length = 0;
};

/// A thread that writes queued frames to one socket, so the worker thread never blocks on a
/// slow receiver while it could reduce. Errors are kept and reported by flush()/error().
class tcp_sender {
 public:
  tcp_sender(tcp_socket& sock, std::string peer);
  ~tcp_sender();
  tcp_sender(const tcp_sender&) = delete;
  tcp_sender& operator=(const tcp_sender&) = delete;
  /// Queues a frame; `data` must stay valid until flush() returned (or `copy` is set).
  void push(frame_type t, const std::byte* data, std::size_t n, bool copy = false);
  /// Queues bytes written as they are, without a frame header (the hello of a TLS ring).
  void push_raw(const std::byte* data, std::size_t n);
  /// Blocks until the queue is written or `deadline`; throws the write error (peer_lost) or timeout.
  void flush(std::chrono::steady_clock::time_point deadline, const std::string& what);
  /// Like flush(), but returns false when `until` passed first.
  bool flush_until(std::chrono::steady_clock::time_point until);
  /// The write error, if any (non-blocking).
  std::optional<troupe::error> error();
  /// Stops writing: finishes the frame being written (1 s at most), sends an abort frame with
  /// `reason`, shuts the socket down. Blocks until the sender reads no queued memory (3 s at most).
  void abort(const std::string& reason) noexcept;

 private:
  struct job {
    frame_type type;
    const std::byte* data;
    std::size_t n;
    std::vector<std::byte> owned;
    bool raw = false;
  };
  void loop();
  bool write_all(const std::byte* p, std::size_t n);

  tcp_socket* sock_;
  int fd_;
  std::string peer_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<job> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  bool stopped_ = false;  // the loop ended: no frame is read any more
  std::optional<std::chrono::steady_clock::time_point> give_up_;  // sender thread only
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;
  std::optional<troupe::error> err_;
  std::thread thread_;
};

/// One rank's sockets: the ring to its neighbours and lazily made point-to-point connections.
/// Collectives run on one worker thread, sends on another, receives on a third.
class tcp_transport {
 public:
  tcp_transport(const rendezvous& store, int rank, int world, const std::string& name, const process_group_options& opts);
  ~tcp_transport();
  tcp_transport(const tcp_transport&) = delete;
  tcp_transport& operator=(const tcp_transport&) = delete;

  int rank() const noexcept { return rank_; }
  int world() const noexcept { return world_; }
  int next() const noexcept { return (rank_ + 1) % world_; }
  int prev() const noexcept { return (rank_ + world_ - 1) % world_; }
  std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }

  /// Sets the deadline of the operation that starts now on lane `l` and names it for messages.
  void begin(lane l, std::string what);
  /// The fingerprint exchange of Note [tcp ring]; throws collective_mismatch, peer_lost, timeout.
  void enter(const fingerprint& f);
  /// A barrier that, past `timeout`, throws errc::timeout naming the rank waited on; unlike
  /// shared memory this breaks the group (late entries would put the ring out of step).
  void enter_monitored(const fingerprint& f, std::chrono::milliseconds timeout);
  /// Queues `n` bytes at `p` as a data frame to rank next(); `p` stays valid until flush().
  void send_next(const std::byte* p, std::size_t n);
  /// Reads the next data frame from rank prev(), which must hold exactly `n` bytes, into `p`.
  void recv_prev(std::byte* p, std::size_t n);
  /// Blocks until everything queued to next() was written (bounded by the deadline).
  void flush();
  /// Marks this rank failed: tells next() why, closes the ring (peers fail at once).
  void abort(const std::string& reason) noexcept;
  /// Marks this rank failed without telling the peers (they reach their own deadlines); a later
  /// abort() still tells next(), with this first reason.
  void mark_broken(const std::string& reason) noexcept;
  /// The node declared a member lost (Note [group peer loss]): every wait of this rank fails
  /// with peer_lost and `reason` within one poll slice. Never blocks.
  void peer_lost(const std::string& reason) noexcept { mark_broken(reason); }

  /// Point-to-point: the frame (meta, then data) to `dst` over its own connection.
  void p2p_send(int dst, const fingerprint& meta, const std::byte* p, std::size_t n);
  /// Receives the meta of the next message from `src`.
  fingerprint p2p_recv_meta(int src);
  /// Receives `n` data bytes from `src` into `p` (`p` null: drops them).
  void p2p_recv_data(int src, std::byte* p, std::size_t n);

  /// Note [collective payload faults], repeat: queues the fingerprint of the collective this
  /// rank entered last to next() again; next() drops it by its sequence number. Worker thread.
  void repeat_entry();
  /// Sends the last message to `dst` again (meta with the same sequence number, then the `n`
  /// bytes at `p`); `dst` drops it in its next p2p_recv_meta. Send thread.
  void repeat_send(int dst, const std::byte* p, std::size_t n);
  /// Tells `dst` that this rank's send to it failed with `reason`: an abort frame on the p2p
  /// connection (made if needed), so the matching recv fails at once with peer_lost. Send
  /// thread; bounded by the send's deadline; never throws.
  void p2p_abort(int dst, const std::string& reason) noexcept;
  /// Repeats dropped on arrival (fingerprints and p2p messages) since the last call.
  std::uint64_t take_repeats() noexcept { return repeats_.exchange(0); }

  /// "process_group '<name>'" for messages.
  std::string label() const;

 private:
  struct peer_addr {
    std::string host;
    int port = 0;
  };
  /// Connects to `peer` and writes the hello, or with `hello_out` stores it there unsent.
  // `op` is the operation of the calling lane: its name for messages, its deadline for waits.
  tcp_socket connect_to(const lane_operation& op, int peer, std::uint32_t kind, std::vector<std::byte>* hello_out = nullptr);
  tcp_socket take_incoming(const lane_operation& op, std::uint32_t kind, int peer);
  bool accept_one(const lane_operation& op);
  frame_header read_header(const lane_operation& op, tcp_socket& s, int peer);
  void read_exact(const lane_operation& op, tcp_socket& s, int peer, std::byte* p, std::size_t n);
  void write_exact(const lane_operation& op, tcp_socket& s, int peer, const std::byte* p, std::size_t n);
  void check_failed(const lane_operation& op);
  /// Passes the fingerprints around the ring; every rank's, indexed by rank.
  std::vector<fingerprint> gather_fingerprints(const fingerprint& f);
  /// Throws when writing to next() failed: the abort frame prev() passes on within 300 ms if
  /// one comes (it names the first failure), else the write error.
  void check_sender(const lane_operation& op);
  [[noreturn]] void fail_timeout(const lane_operation& op, int peer);
  lane_operation& op(lane l) noexcept { return ops_[static_cast<int>(l)]; }

  int rank_;
  int world_;
  std::string name_;
  std::size_t chunk_bytes_;
  std::chrono::milliseconds timeout_;
  std::uint64_t nonce_ = 0;
  std::vector<peer_addr> addrs_;
  std::shared_ptr<const tls_context> tls_;  // null: plain TCP
  tcp_socket listener_;
  tcp_socket ring_out_;
  tcp_socket ring_in_;
  std::unique_ptr<tcp_sender> sender_;
  std::mutex accept_mu_;
  std::map<std::pair<std::uint32_t, int>, tcp_socket> pending_;
  std::vector<tcp_socket> p2p_out_;  // send thread only
  std::vector<tcp_socket> p2p_in_;   // receive thread only
  std::vector<fingerprint> p2p_last_out_;  // send thread: the last meta sent to each rank (seq numbers them)
  std::vector<std::uint32_t> p2p_seq_in_;  // receive thread: the last sequence number taken from each rank
  std::atomic<std::uint64_t> repeats_{0};  // repeats dropped on arrival (take_repeats)
  std::atomic<bool> aborted_{false};
  std::mutex abort_mu_;
  std::string abort_reason_;
  bool told_next_ = false;  // under abort_mu_
  fingerprint last_fp_{};   // the collective this rank entered last (worker thread)
  lane_operation ops_[lane_count];  // one per lane (its own thread only)
};

/// Which transport a group uses: `requested`, or for automatic shared memory when every rank
/// published the same host identity (hostname + kernel boot id), TCP otherwise. Blocks on the
/// store up to `timeout` (errc::timeout).
transport_kind choose_transport(const rendezvous& store, int rank, int world, const std::string& name,
                                transport_kind requested, std::chrono::milliseconds timeout);

// The collectives over the ring (Note [tcp ring]); the same contracts as the shm ones.
void run_allreduce(tcp_transport& tp, std::uint32_t seq, const tensor& t, reduce_op op);
void run_broadcast(tcp_transport& tp, std::uint32_t seq, const tensor& t, int root);
void run_allgather(tcp_transport& tp, std::uint32_t seq, const tensor& out, const tensor& in);
void run_reduce_scatter(tcp_transport& tp, std::uint32_t seq, const tensor& out, const tensor& in, reduce_op op);
void run_barrier(tcp_transport& tp, std::uint32_t seq);
// The data movement after the fingerprint exchange (as the shm move_* in collectives.hpp).
void move_allreduce(tcp_transport& tp, std::uint32_t seq, const tensor& t, reduce_op op);
void move_broadcast(tcp_transport& tp, const tensor& t, int root);
void move_allgather(tcp_transport& tp, const tensor& out, const tensor& in);
void run_send(tcp_transport& tp, p2p_counters& pc, const tensor& t, int dst, int tag);
void run_recv(tcp_transport& tp, p2p_counters& pc, const tensor& t, int src, int tag);

}  // namespace troupe::ddp::detail
