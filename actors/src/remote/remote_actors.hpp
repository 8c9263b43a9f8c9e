#pragma once
// Remote actors: CAF proxies of actors in other processes, over the direct channel.
//
// Note [remote actors]
// A handle to an actor of another node is an ordinary CAF handle. Its actor is a remote_proxy
// (remote/remote_proxy.hpp). This node's proxy_registry makes it through remote_actors, its
// backend. Sending to it serializes the message and writes it as one actor frame on the
// connection to that node (Note [direct channel]). The receiving node enqueues it to the local
// actor on the thread that read the frame (no executor job).
//
//   A: actor a --send/request--> proxy(b) --[frame actor: sender id, receiver id, message id,
//      content]--> connection A<->B --> B's reading thread: proxy(a) = sender; b->enqueue
//   B: b replies to proxy(a) --[frame actor, response id]--> same connection --> a->enqueue
//
// Connections. Each peer node has one connection that carries its actor frames both ways. It is
// the first one used for actor traffic. That is this node's outgoing connection to it when a
// lookup made the proxy, or the peer's incoming connection when the peer spoke first. It stays
// the channel until it closes, so the frames of one sender to one receiver keep their order,
// large or small. A tensor of 1 MiB or more goes as a shared-memory segment handle when the peer
// is on the same host and can open our memory. Every other tensor goes as inline bytes
// (Note [tensor over shared memory]).
//
// Monitoring. A new proxy sends `watch(id)` (an actor_control frame) to its node. That node
// attaches to the actor and answers `down(id, reason)` when it exits, or at once when no actor
// has that id. On `down` the proxy is killed with the reason, so monitors get down_msg and links
// exit_msg, as for a local actor. A message to an unknown or exited actor is answered at once:
// a request with an error response (sec::request_receiver_down naming the worker and id), and a
// `down` for it. A link is a message (link_atom) the receiving node turns into a link between the
// actor and its proxy of the linker, as CAF's BASP does.
//
// Failure. Two events kill every proxy of a node with errc::peer_lost naming the worker. One is
// its connection closing (EOF after a SIGKILL, a malformed frame, an error). The other is the
// node seeing the peer go down (a frozen peer: the middleman heartbeat). A killed proxy fails the requests it
// forwarded that got no response yet. Their requesters get the error at once, not at their
// timeout. It also fails every later request to it at once.
//
// CUDA tensors follow a call's rules (Note [rpc device map]). A request or a one-way message
// takes the sender's device map for the receiving worker. Its CUDA tensors land on the mapped
// devices, staged through host memory (kind 3). A device without an entry fails the send with
// device_mismatch naming the device and the worker; a request gets the error. A response keeps
// its devices (kind 4). It lands on the requester's device by the reverse of the requester's
// map for the responder. Actor messages never go by CUDA IPC handle: a one-way
// message has no answer that would say when the sender may free its private copy. A received
// CUDA tensor is ready on every stream when the actor sees it.
//
// Codec failures. CAF 0.17.6 drops the error of one element of a message. A tensor that cannot
// be written, or a type that is not announced, would leave a truncated message. The peer would
// read it as `()`. So the node checks that every element's type is announced before it writes.
// A tensor's inspect notes its failure on the node's execution unit (note_actor_codec_failure).
// A message that failed to write is not sent:
//   - a request gets the error (device_mismatch or bad_argument) at once;
//   - a response is replaced by that error, so its requester fails at once;
//   - a one-way message is dropped with a line on stderr.
// A message that failed to read is not delivered:
//   - a request is answered with the error;
//   - a response becomes the error its requester gets;
//   - a one-way message is dropped with a line on stderr.
//
// Faults. Message frames pass the transport hook as message_kind::actor_message.
//   - A dropped request leaves its requester waiting until its request timeout.
//   - A duplicated message is delivered twice. A request is handled twice; the requester takes
//     the first response and CAF discards the second.
//   - Delays and reorders change arrival order across messages.
// Control frames (watch, down) are not faulted: they carry failure detection itself.
//
// Sizes. A message frame holds at most node_options::max_message_bytes; a larger message fails
// at its sender (a request gets bad_argument), and a peer announcing more is dropped. Frames are
// read by a bounded_deserializer (Note [bounded CAF reader]): no length in a message allocates
// more than the frame holds; a malformed message answers a request with protocol_violation.
//
// Limits. A message whose sender is itself a proxy travels anonymously (no reply path through a
// third node). A handle to an actor on a node this node has no connection to (received inside a
// message) answers requests with an error and never goes down.

#include <caf/actor_system.hpp>
#include <caf/proxy_registry.hpp>
#include <caf/scoped_execution_unit.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "rpc/actor_frames.hpp"
#include "troupe/actors/worker_info.hpp"

namespace troupe::detail {

class direct_channel;
class bulk_names;
}  // namespace troupe::detail
namespace troupe::rpc {
class device_maps;
}  // namespace troupe::rpc
namespace troupe::detail {

class bounded_deserializer;

/// The head of an actor message frame: sender (0: anonymous), receiver, message id. The
/// content (a caf::message) follows it.
struct actor_message_head {
  caf::actor_id from = 0;
  caf::actor_id dest = 0;
  std::uint64_t mid = 0;
};

/// An actor control frame: an operation (0 watch, 1 down), an actor id, a reason.
struct actor_control_frame {
  std::uint8_t op = 0;
  caf::actor_id id = 0;
  caf::error reason;
};

/// Reads the head of a message frame's body; false when it is malformed.
bool read_message_head(bounded_deserializer& src, actor_message_head& head);
/// Reads the content after the head; empty when it decoded and no byte is left, else why not.
/// Never throws (a CAF loader that throws on a bad variant index gives its reason).
/// Actor handles inside make proxies through the reader's execution unit.
std::string read_message_content(caf::actor_system& sys, bounded_deserializer& src, caf::message& content);
/// Reads a control frame's body; false when it is malformed or has bytes left.
bool read_control_frame(bounded_deserializer& src, actor_control_frame& frame);

/// A connection to a named worker and that worker's node.
struct actor_peer {
  caf::node_id node;
  std::shared_ptr<channel_conn> conn;
};

/// This node's remote actor layer (see the note). Thread-safe.
class remote_actors final : public caf::proxy_registry::backend,
                            public actor_frame_sink,
                            public std::enable_shared_from_this<remote_actors> {
 public:
  /// Resolves a worker by name (connects the first time); throws troupe::error.
  using resolver = std::function<actor_peer(const std::string& worker, std::chrono::milliseconds timeout)>;
  /// `maps`: the node's device maps (Note [rpc device map]); it outlives this object.
  remote_actors(caf::actor_system& sys, worker_info me, std::shared_ptr<direct_channel> channel, std::shared_ptr<bulk_names> bulk,
                const rpc::device_maps& maps, resolver resolve);
  ~remote_actors() override;

  /// A handle to actor `id` of `worker`; blocks to resolve the worker the first time. Throws
  /// troupe::error (peer_lost, timeout).
  caf::strong_actor_ptr proxy_for(const std::string& worker, caf::actor_id id, std::chrono::milliseconds timeout);
  /// Kills every proxy (invalid_state) and forgets every peer. Node teardown; idempotent.
  void shutdown();
  caf::actor_system& system() { return sys_; }
  /// The connection that carries the actor frames of `node` now, or null (Note [caller reads
  /// actor replies]).
  std::shared_ptr<channel_conn> channel_of(const caf::node_id& node) { return conn_to(node); }
  const std::shared_ptr<direct_channel>& channel() const { return channel_; }
  const worker_info& me() const { return me_; }

  /// Sends one message to actor `dest` of node `to` (remote_proxy::enqueue). Never blocks but on
  /// a full socket; failures answer a request with an error.
  void forward(const caf::node_id& to, caf::strong_actor_ptr sender, caf::actor_id dest, caf::message_id mid, caf::message content);
  /// forward() later, on the channel's I/O thread: for callers that hold an actor's lock
  /// (add_backlink runs under the linker's lock, and serializing the linker locks it again).
  void forward_later(const caf::node_id& to, caf::actor_id dest, caf::message content);
  /// Answers request `mid` of `sender` with `err` (no-op for other messages).
  static void bounce(const caf::strong_actor_ptr& sender, caf::message_id mid, const caf::error& err);
  /// The worker name of `node`, or its node id as text.
  std::string worker_of(const caf::node_id& node);

  // proxy_registry::backend
  caf::strong_actor_ptr make_proxy(caf::node_id nid, caf::actor_id aid) override;
  void set_last_hop(caf::node_id*) override {}
  // actor_frame_sink
  void on_actor_frame(const std::shared_ptr<channel_conn>& c, bool control, const char* body, std::size_t n) override;
  void on_conn_lost(const std::shared_ptr<channel_conn>& c, const std::string& why) override;

 private:
  enum class control_op : std::uint8_t { watch = 0, down = 1 };
  struct peer_entry {
    std::shared_ptr<channel_conn> conn;
    std::string name;
  };
  std::shared_ptr<channel_conn> conn_to(const caf::node_id& node);
  void adopt(const std::shared_ptr<channel_conn>& c);
  void send_control(const caf::node_id& to, control_op op, caf::actor_id id, caf::error reason);
  void on_message(const std::shared_ptr<channel_conn>& c, const char* body, std::size_t n);
  void on_control(const std::shared_ptr<channel_conn>& c, const char* body, std::size_t n);
  void watch(const std::shared_ptr<channel_conn>& c, caf::actor_id id);
  bool intercept_link(const caf::strong_actor_ptr& dst, caf::message& content);

  caf::actor_system& sys_;
  worker_info me_;
  std::shared_ptr<direct_channel> channel_;
  std::shared_ptr<bulk_names> bulk_;
  const rpc::device_maps& maps_;
  resolver resolve_;
  caf::scoped_execution_unit ctx_;  // serialization context: the system and our proxy registry
  caf::proxy_registry proxies_;
  std::mutex mutex_;
  std::map<caf::node_id, peer_entry> peers_;
  std::set<std::pair<caf::actor_id, caf::node_id>> watched_;  // (local actor, watching node)
  bool down_ = false;
};

}  // namespace troupe::detail
