#pragma once
/// \file transport.hpp
/// The one interception point for every RPC message and remote actor message on the direct
/// channel. Fault injection and distributed autograd plug in here; the default is a
/// pass-through.
///
/// Note [transport hook]
///
/// Every rpc_request and rpc_response a node sends passes `on_send` on the sender. Every one
/// it receives passes `on_receive` on the receiver, before anything else looks at it. Remote
/// actor messages do too (message_kind::actor_message, Note [remote actors]), on the sending
/// actor's thread and on the thread that reads them. It may
/// rewrite the payload and the interceptor meta, and its decision drops, delays or duplicates the
/// message. It runs on one of three threads (Note [direct channel]). The calling user thread
/// runs it for a request sent, the executor thread for a request received or a response sent.
/// The node's I/O thread runs it for a response received and for delayed messages. It must not
/// block.
///
///   user thread --on_send--> [TCP] --on_receive--> executor (leader)
///
/// Guarantees: a dropped request leaves the caller's call pending until its deadline (timeout)
/// or its peer's death (peer_lost). No message is ever retried by the runtime: user functions
/// are not idempotent.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe {

/// What an intercepted message is.
/// `actor_message`: a remote actor message (Note [remote actors]); its payload is the opaque
/// frame, which a hook must not rewrite.
/// store_request and store_response: a node's store calls and their answers (Note [store faults]
/// in src/store_client.cpp); `function` is the operation (troupe.store.get, ...), `payload` the key.
/// collective_payload: one rank's payload of one collective of a CPU process group
/// (Note [collective payload faults] in ddp/src/payload_faults.hpp). `function` is the
/// collective ("allreduce", "send", ...) and `call_id` its sequence number. `from` is "rank R"
/// of the group, `to` the group's name, `payload` its note ("bucket 2"). Only on_send sees it;
/// a hook may drop or delay it, not duplicate it.
enum class message_kind : std::uint8_t {
  rpc_request = 0,
  rpc_response = 1,
  actor_message = 2,
  store_request = 3,
  store_response = 4,
  collective_payload = 5
};

/// One intercepted message. `payload` is owned by the envelope while the hook runs.
struct envelope {
  message_kind kind = message_kind::rpc_request;
  std::string from;      ///< sending worker's name
  std::string to;        ///< receiving worker's name
  std::uint64_t call_id = 0;
  std::string function;  ///< the function (requests only)
  std::vector<char> payload;
  std::vector<char> meta;  ///< the call interceptor's bytes (Note [call interceptor]); may be rewritten
};

/// What to do with an intercepted message.
struct transport_decision {
  /// 0 drops the message, 1 delivers it, n > 1 delivers n copies.
  int copies = 1;
  /// Delivery delay (0 = now).
  std::chrono::milliseconds delay{0};
};

/// The interception interface. Implementations must be thread-safe (several agents of a test
/// process may share one) and must not block.
class transport_hook {
 public:
  virtual ~transport_hook() = default;
  /// Called before a message leaves this node.
  virtual transport_decision on_send(envelope& /*msg*/) { return {}; }
  /// Called when a message arrives at this node, before it is handled.
  virtual transport_decision on_receive(envelope& /*msg*/) { return {}; }
  /// Called when the process of `worker` reaches a named fault point (fault_point()). May not
  /// return (a kill) or block for a while (a pause).
  virtual void on_point(const std::string& /*worker*/, const std::string& /*point*/, std::int64_t /*step*/) {}
  /// Since when everything from worker `from` to worker `to`, heartbeats included, is lost (a
  /// dropping partition, dropped heartbeats); nullopt while it is not. The node declares `from`
  /// lost once that lasts node_options::connection_timeout (Note [silent peers]).
  virtual std::optional<std::chrono::steady_clock::time_point> silent_since(const std::string& /*from*/, const std::string& /*to*/) {
    return std::nullopt;
  }
  /// Whether silent_since may ever answer: the node watches for silent peers only then.
  virtual bool may_silence() const { return false; }
};

}  // namespace troupe
