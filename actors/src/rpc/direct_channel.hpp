#pragma once
// The direct RPC channel between nodes.
//
// Note [direct channel]
// Every call travels over a TCP connection of the direct channel. A node's calls to itself take
// a connection to its own channel. The CAF connection carries the hello (job token), the store
// and the supervision (Note [node agent] in rpc/agent.hpp). Calls skip the CAF agents: each CAF
// hop costs thread hand-offs (docs/benchmarks.md, rpc).
//
//   caller                                          callee
//   hello{token} ===CAF===> agent: token ok, issue_ticket(name, node) -> one-use secret
//             <===CAF=== hello_ack{..., channel_port, secret}
//   connect(channel_port) --channel_auth{name, secret, shm_ok}--> I/O thread: ticket used,
//                                                   the connection goes to the executor's leader
//   user thread: hook.on_send, write --rpc_request--> leading executor thread: hook.on_receive,
//                                                      serve_job (interceptor, bulk, rref caller)
//   waiting caller (or the I/O thread): hook.on_receive, complete <--rpc_response-- same thread:
//                                                      hook.on_send, write
//
// Frames are typed structs (rpc_request, rpc_response, channel_auth; rpc/wire.hpp). The
// connecting side sends requests; the accepting side answers them. Actor frames go both ways on
// an authenticated connection (Note [remote actors] in remote/remote_actors.hpp). Before its
// ticket, a connection may send one small auth frame and nothing else. Anything else drops it:
// garbage, an unknown or reused secret, a request, an oversized frame. The node keeps serving.
// The callee names the caller from the ticket, never from the request. The secret travels only
// over the CAF connection that presented the job token (rpc/channel_listener.hpp).
//
// Leader/follower (executor.hpp): an idle executor thread polls the authenticated incoming
// connections. With one connection it waits in its recv (Note [blocking first read] in
// rpc/channel_conn.hpp). It runs the first request it read itself and queues the rest. It wakes a
// follower to lead before running the user function, so a long call leaves no request unread.
// Quick requests it runs first and wakes nobody for them: reserved RRef control functions
// (function_options::quick) and functions whose recent runs were all short (Note [predicted
// quick] in executor.hpp). A leader reading a large message keeps the lead until a round makes a
// job (Note [lead through a large message] in direct_channel.cpp). Concurrent writers on one
// connection share one send (channel_conn::write).
//
// The caller reads its own response. A thread about to block on its call (get(), wait()) takes
// the connection's reading role: one caller at a time, by CAS on caller_reading, then
// read_mutex. It reads the socket until its call completed, completing every call it reads a
// response for. It first blocks in recv; after a slice without data it polls the socket and its
// eventfd (Note [blocking first read]). A round trip thus costs two wake-ups, as for raw TCP.
// The I/O thread reads an outgoing connection only for calls nobody waits on: unattended calls
// (a continuation, is_ready()) and calls a releasing reader left behind (handed_over). It never
// reads while a caller holds the role. A thread blocked for remote actor replies takes the same
// role through read_replies (Note [caller reads actor replies] in troupe/actors/reply_reader.hpp).
// Safety nets:
//   * the deadline sweep reads a call's connection before timing it out, so a response that
//     came in time is never lost;
//   * every max_poll_ms the I/O thread reads connections with pending calls, so a future nobody
//     waits on still completes;
//   * finish() pokes the reading caller's eventfd when another thread completes its call
//     (deadline, delayed response, peer_down, stop);
//   * EOF seen by the reader drops the connection and fails its calls with peer_lost at once.
//
// Guarantees (with Note [transport hook]):
//   * every request and response passes on_send on its sender and on_receive on its receiver.
//     Both take the same decisions: drop (the call stays pending), copies, and delay. A delay
//     runs from the I/O thread's timer queue, so reordering works;
//   * every pending call completes exactly once (rpc/call_table.hpp): response, deadline, EOF or
//     error (peer_lost naming the worker), the peer's CAF down message (a frozen peer: heartbeat;
//     peer_down()), or stop() (invalid_state);
//   * user functions run only on executor threads;
//   * a writer blocks only on a full socket, and a closed connection ends that wait;
//   * a large same-host tensor still goes through shared memory.
// Parts: direct_channel owns the connections and decides who reads each.
//   frame_reader         reads a connection and routes its frames (Note [frame routing])
//   channel_listener     the listening socket, connection hygiene, tickets
//   call_client          sends calls; completes them from responses (its call_table)
//   call_server          turns requests into executor jobs and answers them
//   actor_frame_carrier  remote actor frames to and from the actor layer
//   frame_sender         writes frames under the hook's decision; the reply batch
//   timer_queue          delayed work on the I/O thread
// Threads: one I/O thread per node (accept, auth, unattended responses, timers, deadlines). A
// frame writer starts on the first frame large enough for fragments (Note [fragments] in
// rpc/fragment.hpp). stop() joins both. A caller reads on its own thread while it would block
// anyway.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <caf/node_id.hpp>

#include "executor.hpp"
#include "rpc/actor_frame_carrier.hpp"
#include "rpc/bulk.hpp"
#include "rpc/call_client.hpp"
#include "rpc/call_server.hpp"
#include "rpc/channel_config.hpp"
#include "rpc/channel_conn.hpp"
#include "rpc/channel_listener.hpp"
#include "rpc/frame_reader.hpp"
#include "rpc/frame_sender.hpp"
#include "rpc/intercept.hpp"
#include "rpc/timer_queue.hpp"
#include "troupe/actors/flight_recorder.hpp"
#include "troupe/actors/messages.hpp"
#include "troupe/actors/rpc/future.hpp"
#include "troupe/actors/rpc/registry.hpp"
#include "troupe/actors/transport.hpp"
#include "troupe/actors/worker_info.hpp"

namespace troupe::detail {

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
  std::uint16_t port() const { return listener_.port(); }
  /// A fresh one-use secret for `peer` (which just presented the job token). Agent thread.
  std::string issue_ticket(const std::string& peer, const caf::node_id& node);
  /// Connects to `peer`'s channel port and authenticates; blocks up to `timeout`. Throws peer_lost.
  /// `shm_ok`: this node can open the peer's memory (told in the auth frame, Note [shm
  /// reachability]).
  std::shared_ptr<channel_conn> connect(const std::string& peer, const caf::node_id& node, const std::string& host,
                                     std::uint16_t port, const std::string& secret, bool shm_ok, std::chrono::milliseconds timeout);
  /// Sends one call over `c` (the calling user thread writes it). Errors complete `st`.
  /// `borrowed`: tensor bytes that belong in `payload`, written before this returns (Note
  /// [borrowed tensor bytes] in rpc/borrowed_parts.hpp).
  void call(const std::shared_ptr<channel_conn>& c, const std::shared_ptr<rpc::detail::call_state>& st, const std::string& function,
            std::vector<char> payload, std::vector<char> meta, rpc::detail::borrowed_parts borrowed = {});
  /// `peer`'s node went down (CAF down message): its connections close, its calls fail (peer_lost).
  void peer_down(const std::string& peer, const std::string& reason);
  /// Closes everything, fails pending calls (invalid_state), joins the I/O thread. Idempotent.
  void stop();

  /// Where actor frames go (Note [remote actors] in remote/remote_actors.hpp). Set before the
  /// first connection (the node does it right after start()).
  void set_actor_sink(std::weak_ptr<actor_frame_sink> sink) { actors_.set_sink(std::move(sink)); }
  /// Sends one actor frame on `c`: `frame` starts with frame_header_size bytes of room for the
  /// header. A message (not `control`) passes the transport hook as message_kind::actor_message.
  /// Runs on the sending thread; blocks only on a full socket. A closed `c` drops it, and so does
  /// a body larger than max_body() (remote_actors::forward refuses those first).
  /// `type`: the message's type names, the hook's envelope function ("actor:NAME", Note [fault plan]).
  void send_actor(const std::shared_ptr<channel_conn>& c, std::vector<char> frame, bool control, std::string type = {}) {
    actors_.send(c, std::move(frame), control, std::move(type));
  }
  /// The largest frame body (or fragmented total) sent or accepted: node_options::max_message_bytes
  /// within [min_message_bytes, max_frame_body]. A peer announcing more is dropped before anything
  /// is allocated; a message of more is refused to its sender.
  std::uint32_t max_body() const {
    return channel_max_body(cfg_);
  }
  /// Runs `fn` on the I/O thread soon (work that must not run under the caller's locks).
  void post(std::function<void()> fn) { later(std::chrono::milliseconds(0), std::move(fn)); }

  /// The calling thread waits for call `st` on `c` by reading `c` itself (Note [direct channel]:
  /// the caller reads its own response). It stops when the call completed, at `until`, or when the
  /// connection closed. It returns at once when another thread reads `c`; the caller then blocks
  /// on the call as before. Completes other calls it reads responses for.
  void read_until_done(const std::shared_ptr<channel_conn>& c, const rpc::detail::call_state& st, clock::time_point until);
  /// The calling thread reads outgoing `c` until `done()` holds, `until` passes or `c` closes,
  /// delivering every frame as the I/O thread would (Note [caller reads actor replies] in
  /// troupe/actors/reply_reader.hpp). False at once when it cannot take the reading role
  /// (incoming `c`, another reader, a read in progress): the caller waits another way.
  bool read_replies(const std::shared_ptr<channel_conn>& c, const std::function<bool()>& done, clock::time_point until);
  /// Makes the thread in read_replies/read_until_done on `c` check its condition again (nothing
  /// when called by that thread or when nobody reads). Any thread.
  void poke_reader(channel_conn& c);
  /// Nobody waits for call `id` on `c` (a continuation, a poll of is_ready()): from now on the I/O
  /// thread reads its response.
  void unattend(const channel_conn* c, std::uint64_t id);

  /// io_source: the leading executor thread reads the authenticated incoming connections and
  /// serves what it read (leader/follower, executor.hpp).
  void lead(led_jobs& got) override;
  void interrupt() override;

 private:
  /// Note [lead through a large message] (direct_channel.cpp): reads on while rounds make no job.
  void read_on(const std::vector<std::shared_ptr<channel_conn>>& polled, led_jobs& jobs);
  void run();
  int poll_timeout_ms();
  void accept_all();
  /// Note [connection hygiene]: closes the waiting connections past their deadline.
  void expire_waiting();
  // `jobs`: where served calls go (the leader's list), or null: posted to the executor.
  using job_list = led_jobs;
  // Reads `c` through reader_ (Note [frame routing]). An incoming connection that has just
  // authenticated then goes to the executor's leader. `block_first`: wait in the first recv
  // (Note [blocking first read] in rpc/channel_conn.hpp).
  void on_readable(const std::shared_ptr<channel_conn>& c, job_list* jobs, bool block_first = false);
  /// Admits an incoming connection whose auth frame redeemed `t` (frame_reader's admit_fn).
  void admit(channel_conn& c, channel_listener::ticket&& t, bool shm_ok);
  void notify_lost(const std::shared_ptr<channel_conn>& c, const std::string& why);
  void drop(const std::shared_ptr<channel_conn>& c, const std::string& why);
  void later(std::chrono::milliseconds delay, std::function<void()> fn);
  frame_sender::later_fn later_fn();  // later() for the parts (they live as long as this)
  void sweep_deadlines();
  // The caller side of waiting (Note [direct channel], "the caller reads its own response").
  std::shared_ptr<rpc::detail::call_helper> make_waiter(const std::shared_ptr<channel_conn>& c);  // for channel_conn::waiter
  // The reading role's loop; the caller holds caller_reading and read_mutex.
  void read_while(const std::shared_ptr<channel_conn>& c, const std::function<bool()>& done, clock::time_point until);
  bool io_reads(const channel_conn& c);  // whether the I/O thread polls `c` now
  bool read_for_io(const std::shared_ptr<channel_conn>& c);
  void release_reading(const std::shared_ptr<channel_conn>& c);
  void read_unwaited(const std::vector<std::shared_ptr<channel_conn>>& outgoing);
  clock::time_point last_unwaited_read_{};  // I/O thread only
  void wake();
  // The I/O thread never sleeps longer than this (a bound, not a polling period: wakes are events).
  static constexpr int max_poll_ms = 200;

  direct_channel_config cfg_;
  channel_listener listener_;  // I/O thread, tickets from any thread
  int wake_fd_ = -1;
  int lead_wake_fd_ = -1;  // interrupts the leader
  std::atomic<bool> lead_interrupted_{false};  // set with lead_wake_fd_: the leader polls, it does not block in a recv
  std::thread io_;
  std::atomic<bool> stopping_{false};

  std::mutex conns_mutex_;  // guards conns_, every led flag, and the peer of a connection that authenticates
  std::vector<std::shared_ptr<channel_conn>> conns_;
  std::atomic<std::uint64_t> conns_gen_{0};  // bumped (under conns_mutex_) whenever conns_ or a led flag changes
  // The led connections as the leader last listed them, and conns_gen_ then (lead() only: one
  // leader at a time).
  std::vector<std::shared_ptr<channel_conn>> led_conns_;
  std::uint64_t led_gen_ = ~std::uint64_t{0};

  timer_queue timers_;
  frame_sender sender_;  // after what its writes use; its writer thread is joined first
  call_server server_;
  actor_frame_carrier actors_;
  call_client client_;
  frame_reader reader_;  // after the parts it routes to
};

}  // namespace troupe::detail
