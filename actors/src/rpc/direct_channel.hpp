#pragma once
// The direct RPC channel between nodes.
//
// Note [direct channel]
// Every call travels over a TCP connection of the direct channel; a node's calls to itself take a
// connection to its own channel. CAF messages through the agents and the BASP broker cost four
// extra thread hops per round trip (measured below), so no call takes them. The CAF connection
// carries the hello (job token), the store and the supervision (monitor + middleman heartbeat;
// Note [node agent] in rpc/agent.hpp).
//
//   caller                                          callee
//   hello{token} ===CAF===> agent: token ok, issue_ticket(name, node) -> one-use secret
//             <===CAF=== hello_ack{..., channel_port, secret}
//   connect(channel_port) --channel_auth{name, secret, shm_ok}--> I/O thread: ticket consumed -> authenticated,
//                                                   the connection goes to the executor's leader
//   user thread: hook.on_send, write --rpc_request--> leading executor thread: hook.on_receive,
//                                                      serve_job (interceptor, bulk, rref caller)
//   waiting caller (or the I/O thread): hook.on_receive, complete <--rpc_response-- same thread:
//                                                      hook.on_send, write
//
// Frames are typed structs (rpc_request, rpc_response, channel_auth) written by CAF's binary
// serializer (rpc/wire.hpp). A connection is one-directional in purpose: the connecting side
// sends requests, the accepting side answers them (actor frames, Note [remote actors] in
// remote/remote_actors.hpp, go both ways on an authenticated connection, and the I/O thread
// always reads an outgoing connection that carries them); nothing but one small valid auth frame is
// accepted first (garbage, an unknown or reused secret, a request, an oversized frame: the
// connection is dropped and logged, the node keeps serving). The callee names the caller from the
// ticket, never from the request. The secret travels only over the CAF connection that presented
// the job token.
//
// Leader/follower (executor.hpp): an idle executor thread polls the authenticated incoming
// connections (one alone: it waits in its recv, Note [blocking first read] in rpc/channel_conn.hpp),
// runs the first request it read itself and queues the rest; it wakes a follower to lead before
// running the user function (otherwise a long call would leave requests unread). Requests for
// quick functions (function_options::quick: the reserved RRef control functions) and for
// functions whose recent runs were all short (Note [predicted quick] in executor.hpp, with its
// watchdog) it runs itself first and wakes nobody for them.
// Concurrent writers on one connection combine their frames into one send (channel_conn::write).
//
// The caller reads its own response (channel_wait.cpp): call_state's helper runs on a thread that is
// about to block on its call (get(), wait()); it takes the connection's reading role (one caller
// at a time, CAS on caller_reading, then read_mutex) and reads the socket itself (first in a
// blocking recv, then, after a slice without data, polling the socket and its eventfd: Note
// [blocking first read]) until its call completed, completing every call it reads a response for. So a round trip is two
// wake-ups (callee leader, caller) as for raw TCP, not three. The I/O thread polls an outgoing
// connection only for calls nobody waits on: unattended ones (a continuation was registered, or
// is_ready() was asked),
// and those a releasing reader left behind (handed_over: threads blocked on their call while
// another read, a waiter whose wait() timed out); it never reads while a caller holds the role.
// Safety nets: before timing a call out the deadline sweep reads its connection (a response that
// came in time is never lost to a late waiter), and at least every max_poll_ms the I/O thread
// reads connections with pending calls (a future nobody ever waits on still completes).
// finish() pokes the reading caller's eventfd, so a completion from elsewhere (deadline, delayed
// response from the hook's timer, peer_down, stop) ends its wait (a completion by the reader itself
// needs none: it checks its call after every read, so no write, poll and read per call); EOF seen by the reader drops the
// connection and fails its calls with peer_lost at once, as on the I/O thread.
//
// Guarantees (with Note [transport hook]):
//   * every request and response passes on_send on its sender and on_receive on its receiver,
//     with the same decisions (drop: the call stays pending; copies; delay, run by the I/O thread
//     from a timer queue, so reordering works);
//   * every pending call completes exactly once: response, deadline (swept by the I/O thread),
//     connection EOF or error (peer_lost naming the worker), the peer's CAF down message (a
//     frozen peer: heartbeat; peer_down()), or stop() (invalid_state);
//   * user functions run only on executor threads; a writer blocks only on a full socket, and a
//     closed connection ends that wait; a large same-host tensor still goes through shared memory.
// Threads: one I/O thread per node (accept, auth, unattended responses, timers, deadlines), and a
// frame writer started on the first frame large enough to go in fragments (Note [fragments] in
// rpc/fragment.hpp); both joined by stop(). A caller reads on its own thread while it would block
// anyway.
//
// Measured on the 2-core build machine (rpc_bench, small rpc_sync round trip, medians; raw TCP
// ping-pong 5.2-5.9 us in the same runs): through the CAF agents 53 us; direct channel with an I/O thread
// handing requests to the executor 27 us (so one CAF hop ~6.5 us); the I/O -> executor hand-off
// ~4.5 us (serving inline on the I/O thread: 22.5 us); leader/follower 20.8-23.3 us (the
// follower's wake-up before the user function stays); the Boost-archive-free codec saved ~2.5 us.
// Then the caller reading its own response (two wake-ups per round trip, like raw TCP), and reads
// without a zero-filled buffer or a recv that only says EAGAIN (a short read drained the socket;
// every reader polls level-triggered): see docs/runtime.md for the table and the busy/idle figures.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <caf/node_id.hpp>

#include "executor.hpp"
#include "rpc/accept_guard.hpp"
#include "rpc/actor_frames.hpp"
#include "rpc/bulk.hpp"
#include "rpc/channel_conn.hpp"
#include "rpc/frame_writer.hpp"
#include "rpc/intercept.hpp"
#include "troupe/actors/flight_recorder.hpp"
#include "troupe/actors/messages.hpp"
#include "troupe/actors/rpc/future.hpp"
#include "troupe/actors/rpc/registry.hpp"
#include "troupe/actors/transport.hpp"
#include "troupe/actors/worker_info.hpp"

namespace troupe::detail {

struct split_frame;
class tls_relays;

/// What the direct channel needs from its node.
struct direct_channel_config {
  worker_info me;
  caf::node_id my_node;
  std::string listen_addr;
  std::shared_ptr<rpc::registry> functions;
  std::shared_ptr<executor> exec;
  std::shared_ptr<bulk_names> bulk;
  std::shared_ptr<transport_hook> hook;
  std::shared_ptr<rpc::detail::interceptor_slot> interceptor;
  /// Note [connection hygiene] (rpc/accept_guard.hpp).
  std::chrono::milliseconds auth_deadline{2000};
  std::size_t max_unauthenticated = 64;
  /// The node's recorder (Note [flight recorder]): served calls are recorded there.
  flight_recorder* recorder = nullptr;
  /// node_options::max_message_bytes: the largest frame body or fragmented total a peer may announce.
  std::uint64_t max_message_bytes = max_frame_body;
  /// Note [tls relay]: with TLS, every connection goes through a relay; null: plain TCP.
  std::shared_ptr<tls_relays> tls;
};

/// One node's direct RPC channel (see the note). Thread-safe.
class direct_channel : public io_source, public std::enable_shared_from_this<direct_channel> {
 public:
  using clock = std::chrono::steady_clock;
  /// Listens on cfg.listen_addr (ephemeral port); throws io_error. Call start() next.
  explicit direct_channel(direct_channel_config cfg);
  ~direct_channel();
  direct_channel(const direct_channel&) = delete;
  direct_channel& operator=(const direct_channel&) = delete;

  /// Starts the I/O thread.
  void start();
  std::uint16_t port() const { return port_; }
  /// A fresh one-use secret for `peer` (which just presented the job token). Agent thread.
  std::string issue_ticket(const std::string& peer, const caf::node_id& node);
  /// Connects to `peer`'s channel port and authenticates; blocks up to `timeout`. Throws peer_lost.
  /// `shm_ok`: this node can open the peer's memory (told in the auth frame, Note [shm
  /// reachability]).
  std::shared_ptr<channel_conn> connect(const std::string& peer, const caf::node_id& node, const std::string& host,
                                     std::uint16_t port, const std::string& secret, bool shm_ok, std::chrono::milliseconds timeout);
  /// Sends one call over `c` (the calling user thread writes it). Errors complete `st`.
  void call(const std::shared_ptr<channel_conn>& c, const std::shared_ptr<rpc::detail::call_state>& st, const std::string& function,
            std::vector<char> payload, std::vector<char> meta);
  /// `peer`'s node went down (CAF down message): its connections close, its calls fail (peer_lost).
  void peer_down(const std::string& peer, const std::string& reason);
  /// Closes everything, fails pending calls (invalid_state), joins the I/O thread. Idempotent.
  void stop();

  /// Where actor frames go (Note [remote actors] in remote/remote_actors.hpp). Set before the
  /// first connection (the node does it right after start()).
  void set_actor_sink(std::weak_ptr<actor_frame_sink> sink) { actor_sink_ = std::move(sink); }
  /// Sends one actor frame on `c`: `frame` starts with frame_header_size bytes of room for the
  /// header. A message (not `control`) passes the transport hook as message_kind::actor_message.
  /// Runs on the sending thread; blocks only on a full socket. A closed `c` drops it, and so does
  /// a body larger than max_body() (remote_actors::forward refuses those first).
  /// `type`: the message's type names, the hook's envelope function ("actor:NAME", Note [fault plan]).
  void send_actor(const std::shared_ptr<channel_conn>& c, std::vector<char> frame, bool control, std::string type = {});
  /// The largest frame body (or fragmented total) sent or accepted: node_options::max_message_bytes
  /// within [min_message_bytes, max_frame_body]. A peer announcing more is dropped before anything
  /// is allocated; a message of more is refused to its sender.
  std::uint32_t max_body() const {
    return static_cast<std::uint32_t>(std::clamp<std::uint64_t>(cfg_.max_message_bytes, min_message_bytes, max_frame_body));
  }
  /// Runs `fn` on the I/O thread soon (work that must not run under the caller's locks).
  void post(std::function<void()> fn) { later(std::chrono::milliseconds(0), std::move(fn)); }

  /// The calling thread waits for call `st` on `c` by reading `c` itself (Note [direct channel]:
  /// the caller reads its own response) until the call completed, `until`, or the connection
  /// closed; returns at once when another thread reads `c` (the caller then blocks on the call as
  /// before). Completes other calls it reads responses for.
  void read_until_done(const std::shared_ptr<channel_conn>& c, const rpc::detail::call_state& st, clock::time_point until);
  /// Nobody waits for call `id` on `c` (a continuation, a poll of is_ready()): from now on the I/O
  /// thread reads its response.
  void unattend(const channel_conn* c, std::uint64_t id);

  /// io_source: the leading executor thread reads the authenticated incoming connections and
  /// serves what it read (leader/follower, executor.hpp).
  void lead(led_jobs& got) override;
  void interrupt() override;

 private:
  struct pending_call {
    std::shared_ptr<rpc::detail::call_state> state;
    const channel_conn* conn;
    std::string function;
    std::multimap<clock::time_point, std::uint64_t>::iterator deadline;
    bool unattended = true;  ///< the I/O thread reads its response (nobody waits on it)
  };
  struct ticket {
    std::string peer;
    caf::node_id node;
  };

  void run();
  int poll_timeout_ms();
  void accept_all();
  /// Note [connection hygiene]: closes the waiting connections past their deadline.
  void expire_waiting();
  // `jobs`: where served calls go (the leader's list), or null: posted to the executor.
  using job_list = led_jobs;
  // `block_first`: wait in the first recv (Note [blocking first read] in rpc/channel_conn.hpp).
  void on_readable(const std::shared_ptr<channel_conn>& c, job_list* jobs, bool block_first = false);
  bool handle_frame(const std::shared_ptr<channel_conn>& c, std::uint8_t kind, const char* body, std::size_t n, job_list* jobs);
  bool on_auth(const std::shared_ptr<channel_conn>& c, const char* body, std::size_t n);
  bool on_fragment(const std::shared_ptr<channel_conn>& c, const char* body, std::size_t n, job_list* jobs);
  /// A message put together from fragments, or read straight into its buffer (Note [direct
  /// fragment data]): handled as its inner frame. False as on_fragment.
  bool on_assembled(const std::shared_ptr<channel_conn>& c, fragment_streams::assembled&& a, job_list* jobs);
  /// Parses the whole frames at the start of `c->in` and starts reading the data of an incomplete
  /// later fragment, or the payload of an incomplete large request or response, straight into its
  /// buffer (Note [direct fragment data]); erases what it used. False: `c` was dropped.
  bool parse_frames(const std::shared_ptr<channel_conn>& c, job_list* jobs);
  /// Drops `c` for a malformed frame (and says so on stderr).
  void drop_malformed(const std::shared_ptr<channel_conn>& c);
  void on_request(const std::shared_ptr<channel_conn>& c, rpc_request req, job_list* jobs);
  void serve(const std::shared_ptr<channel_conn>& c, rpc_request req, int copies, job_list* jobs);
  void respond(const std::shared_ptr<channel_conn>& c, rpc_response resp);
  /// An actor frame read from `c` (channel_actors.cpp).
  void on_actor_frame(const std::shared_ptr<channel_conn>& c, bool control, const char* body, std::size_t n);
  void notify_lost(const std::shared_ptr<channel_conn>& c, const std::string& why);
  void on_response(const std::shared_ptr<channel_conn>& c, rpc_response resp);
  void finish(const channel_conn* c, std::uint64_t id, errc code, std::string msg, std::vector<char> payload, std::vector<char> meta);
  void fail_calls_on(const channel_conn* c, const std::string& peer, const std::string& why);
  void drop(const std::shared_ptr<channel_conn>& c, const std::string& why);
  void send_copies(const std::shared_ptr<channel_conn>& c, std::vector<char> frame, const transport_decision& d);
  void send_frame(const std::shared_ptr<channel_conn>& c, const std::vector<char>& frame, const transport_decision& d);
  /// send_copies of a frame with a large payload (rpc/split_frame.hpp), without copying it.
  void send_split(const std::shared_ptr<channel_conn>& c, const split_frame& f, const transport_decision& d);
  /// Sends `msg` (an rpc_request or rpc_response with a large payload) as a split frame: one
  /// large enough to go in fragments is written by writer_ (Note [fragments]), the rest at once;
  /// its payload buffer then goes back to the pool. False when it cannot be framed (nothing sent).
  template <class T>
  bool send_large(const std::shared_ptr<channel_conn>& c, frame_kind kind, T msg, const transport_decision& d);
  void later(std::chrono::milliseconds delay, std::function<void()> fn);
  void run_timers();
  void sweep_deadlines();
  // Caller side of waiting (channel_wait.cpp).
  void install_helper(const std::shared_ptr<channel_conn>& c, rpc::detail::call_state& st, std::uint64_t id);
  std::shared_ptr<rpc::detail::call_helper> make_waiter(const std::shared_ptr<channel_conn>& c);  // for channel_conn::waiter
  bool io_reads(const channel_conn& c);  // whether the I/O thread polls `c` now
  // The connection this thread reads as a waiting caller (finish() then needs no poke: the
  // reader checks its call after every read).
  static thread_local const channel_conn* reading_here_;
  bool read_for_io(const std::shared_ptr<channel_conn>& c);
  void release_reading(const std::shared_ptr<channel_conn>& c);
  void read_unwaited(const std::vector<std::shared_ptr<channel_conn>>& outgoing);
  clock::time_point last_unwaited_read_{};  // I/O thread only
  void wake();
  void wake_if_first_deadline(clock::time_point deadline);
  // The I/O thread never sleeps longer than this (a bound, not a polling period: wakes are events).
  static constexpr int max_poll_ms = 200;

  direct_channel_config cfg_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  int lead_wake_fd_ = -1;  // interrupts the leader
  std::atomic<bool> lead_interrupted_{false};  // set with lead_wake_fd_: the leader polls, it does not block in a recv
  std::uint16_t port_ = 0;
  std::thread io_;
  accept_guard accept_;  // I/O thread
  // Accepted connections that have not authenticated, oldest first, with their deadlines (I/O
  // thread; entries that authenticated or closed since are skipped).
  std::deque<std::pair<clock::time_point, std::weak_ptr<channel_conn>>> waiting_;
  frame_writer writer_;  // large frames, Note [fragments]
  std::atomic<bool> stopping_{false};

  std::mutex conns_mutex_;
  std::vector<std::shared_ptr<channel_conn>> conns_;
  std::map<std::string, ticket> tickets_;  // secret -> issued for
  std::atomic<std::uint64_t> conns_gen_{0};  // bumped (under conns_mutex_) whenever conns_ or a led flag changes
  // The led connections as the leader last listed them, and conns_gen_ then (lead() only: one
  // leader at a time).
  std::vector<std::shared_ptr<channel_conn>> led_conns_;
  std::uint64_t led_gen_ = ~std::uint64_t{0};

  std::mutex pending_mutex_;
  std::uint64_t next_id_ = 1;
  std::unordered_map<std::uint64_t, pending_call> pending_;
  std::multimap<clock::time_point, std::uint64_t> deadlines_;

  std::mutex timers_mutex_;
  std::multimap<clock::time_point, std::function<void()>> timers_;

  std::weak_ptr<actor_frame_sink> actor_sink_;
};

}  // namespace troupe::detail
