#pragma once
/// \file messages.hpp
/// Every message type that crosses a process boundary, with its CAF `inspect()`. Also the one
/// registration function that announces them all (CAF-0.17-NOTES, pitfall 4: unannounced types
/// vanish). No message holds a float or double: payloads are byte vectors that CAF copies raw
/// (pitfall 1).

#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/meta/type_name.hpp>

#include "troupe/actors/worker_info.hpp"

namespace caf {
class actor_system_config;
}

namespace troupe {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_info& x) {
  return f(caf::meta::type_name("troupe.worker_info"), x.name, x.rank, x.world_size);
}

/// A node's shared-memory probe (Note [shm reachability], src/rpc/bulk.hpp). It is a tiny memfd
/// of the sending process. The receiver tries to open it the way it would open a tensor segment.
/// pid 0: none (shared memory off on that node, or not the same host).
struct shm_probe {
  std::int32_t pid = 0;
  std::int32_t fd = -1;
  std::string name;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shm_probe& x) {
  return f(caf::meta::type_name("troupe.shm_probe"), x.pid, x.fd, x.name);
}

/// Sent by a node that said hello to the peer's agent. It is sent when the node cannot open the
/// peer's probe although the peer could open its own, or the reverse. The peer's sends switch
/// to match (Note [shm reachability]).
struct shm_verdict {
  bool ok = false;  ///< the sender can open the receiver's segments
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shm_verdict& x) {
  return f(caf::meta::type_name("troupe.shm_verdict"), x.ok);
}

/// First message on every connection (Note [job token]): the caller's token, identity and agent.
struct hello {
  std::string token;
  worker_info info;
  caf::actor agent;
  shm_probe shm;  ///< the caller's probe (Note [shm reachability])
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, hello& x) {
  return f(caf::meta::type_name("troupe.hello"), x.token, x.info, x.agent, x.shm);
}

/// Answer to a hello with the right token. It holds the callee's identity, its agent and, on
/// rank 0, the store. It holds its direct rpc port with a one-use secret for this caller
/// (Note [direct channel]; port 0: none). It holds its shared-memory probe and whether it could
/// open the caller's (Note [shm reachability]).
struct hello_ack {
  worker_info info;
  caf::actor agent;
  caf::actor store;
  std::uint16_t channel_port = 0;
  std::string channel_secret;
  shm_probe shm;        ///< the callee's probe
  bool shm_ok = false;  ///< the callee opened the caller's probe
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, hello_ack& x) {
  return f(caf::meta::type_name("troupe.hello_ack"), x.info, x.agent, x.store, x.channel_port, x.channel_secret, x.shm, x.shm_ok);
}

/// One RPC request frame of the direct channel (Note [direct channel]). `payload` is the codec's byte vector; `meta` the
/// call interceptor's bytes (Note [call interceptor]; empty when none), copied raw.
struct rpc_request {
  std::uint64_t id = 0;
  std::string function;
  std::string caller;
  std::vector<char> payload;
  std::vector<char> meta;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rpc_request& x) {
  return f(caf::meta::type_name("troupe.rpc_request"), x.id, x.function, x.caller, x.payload, x.meta);
}

/// The answer to an rpc_request: code 0 and the encoded result, or an errc and its message;
/// `meta` as in rpc_request (the serve scope's bytes).
struct rpc_response {
  std::uint64_t id = 0;
  std::uint8_t code = 0;
  std::string message;
  std::vector<char> payload;
  std::vector<char> meta;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rpc_response& x) {
  return f(caf::meta::type_name("troupe.rpc_response"), x.id, x.code, x.message, x.payload, x.meta);
}

// --- store protocol (Note [store]); replies are plain strings, integers and booleans ---------

struct store_set { std::string key; std::string value; };
struct store_get { std::string key; std::int64_t timeout_ms = 0; };
struct store_add { std::string key; std::int64_t delta = 0; };
struct store_wait { std::vector<std::string> keys; std::int64_t timeout_ms = 0; };
struct store_cas { std::string key; std::string expected; std::string desired; };
struct store_erase { std::string key; };
struct store_num_keys { std::int32_t unused = 0; };
struct store_barrier { std::string name; std::int32_t rank = 0; std::int32_t world_size = 0; std::int64_t timeout_ms = 0; };

template <class I> typename I::result_type inspect(I& f, store_set& x) {
  return f(caf::meta::type_name("troupe.store_set"), x.key, x.value);
}
template <class I> typename I::result_type inspect(I& f, store_get& x) {
  return f(caf::meta::type_name("troupe.store_get"), x.key, x.timeout_ms);
}
template <class I> typename I::result_type inspect(I& f, store_add& x) {
  return f(caf::meta::type_name("troupe.store_add"), x.key, x.delta);
}
template <class I> typename I::result_type inspect(I& f, store_wait& x) {
  return f(caf::meta::type_name("troupe.store_wait"), x.keys, x.timeout_ms);
}
template <class I> typename I::result_type inspect(I& f, store_cas& x) {
  return f(caf::meta::type_name("troupe.store_cas"), x.key, x.expected, x.desired);
}
template <class I> typename I::result_type inspect(I& f, store_erase& x) {
  return f(caf::meta::type_name("troupe.store_erase"), x.key);
}
template <class I> typename I::result_type inspect(I& f, store_num_keys& x) {
  return f(caf::meta::type_name("troupe.store_num_keys"), x.unused);
}
template <class I> typename I::result_type inspect(I& f, store_barrier& x) {
  return f(caf::meta::type_name("troupe.store_barrier"), x.name, x.rank, x.world_size, x.timeout_ms);
}

/// Announces every message type above and the `troupe` error category with `cfg`. Call it once
/// per config before the actor system starts (node does it for you).
void register_messages(caf::actor_system_config& cfg);

}  // namespace troupe
