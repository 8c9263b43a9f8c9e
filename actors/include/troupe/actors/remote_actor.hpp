#pragma once
/// \file remote_actor.hpp
/// Training actors across processes: message types, publish by name, lookup by (worker, name).
/// A looked-up actor is an ordinary CAF handle. `send`, `request(h, timeout, ...).then/await`,
/// `scoped_actor` request/receive, `monitor` and `link` work across processes. They keep CAF's
/// own semantics (Note [remote actors] in src/remote/remote_actors.hpp).
///
///   // every process, before its node starts
///   troupe::node_options opts = troupe::node_options::from_env();
///   troupe::add_actor_message_type<grad_push>(opts, "grad_push");
///   troupe::node n(opts);
///   // rank 0
///   auto ps = n.system().spawn(parameter_server);
///   troupe::publish_actor(n, ps, "ps");
///   // any rank
///   auto ps = troupe::lookup_actor<ps_actor>(n, "worker0", "ps", std::chrono::seconds(10));
///   self->request(ps, std::chrono::seconds(5), grad_push{...}).receive(...);
///
/// Guarantees: messages from one sender to one receiver arrive in send order, large and small
/// alike. A peer that dies, or freezes past the heartbeat timeout, kills its actors' handles
/// with errc::peer_lost naming the worker. Monitors get down_msg, links exit_msg, and open
/// requests fail at once. A request to an actor that exited fails at once with
/// caf::sec::request_receiver_down naming the worker. Tensors in messages have value semantics
/// and travel as RPC's do: shared memory between processes of one host from 1 MiB, inline bytes
/// otherwise.
///
/// Message fields: CAF's own float and double serialization is lossy and can hang
/// (CAF-0.17-NOTES pitfall 1). Carry floating-point data in a tensor, never in a float or
/// double field.

#include <chrono>
#include <cstdint>
#include <exception>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include <caf/actor_cast.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/deserializer.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/sec.hpp>
#include <caf/serializer.hpp>

#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/node_options.hpp"
#include "troupe/actors/rpc/codec.hpp"
#include "troupe/tensors/tensor.hpp"

namespace troupe {

namespace detail {
/// The codec context a node serializes an actor message under (Note [codec context]). It is the
/// one its execution unit carries when the node writes a message to a peer, else the plain one.
const rpc::codec_context& actor_codec_context(caf::execution_unit* unit);
/// Records why a tensor in an actor message could not be written or read. It records on the
/// execution unit the node serializes under; the first failure counts. CAF 0.17.6 drops an
/// element's error inside a message: the sender writes a truncated message, the receiver reads
/// `()`. So the node reads the failure from there. A unit of another kind ignores it.
void note_actor_codec_failure(caf::execution_unit* unit, const error& e);
}  // namespace detail

/// CAF inspection of a tensor in an actor message: its bytes in RPC's tensor encoding
/// (Note [rpc payload]), so no float goes through CAF. A serializer writes a value copy. A
/// same-host peer gets a shared-memory segment from 1 MiB, by the codec context of the message.
/// A deserializer makes a new tensor. Any other inspector (to_string) sees a short description.
/// A CUDA tensor follows the sender's device map for the receiving worker (Note [remote actors]).
/// A device without an entry fails the send with device_mismatch naming the device and the worker.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tensor& x) {
  if constexpr (std::is_base_of_v<caf::serializer, Inspector>) {
    std::vector<char> bytes;
    try {
      rpc::detail::writer w(bytes, detail::actor_codec_context(f.context()));
      rpc::detail::write_tensor(w, x);
    } catch (const error& e) {  // keeps its code: the sender tells device_mismatch apart
      const error failure(e.code(), "cannot encode a tensor: " + e.message());
      detail::note_actor_codec_failure(f.context(), failure);
      return to_caf_error(failure);
    } catch (const std::exception& e) {
      const error failure(errc::bad_argument, std::string("cannot encode a tensor: ") + e.what());
      detail::note_actor_codec_failure(f.context(), failure);
      return to_caf_error(failure);
    }
    return f(bytes);
  } else if constexpr (std::is_base_of_v<caf::deserializer, Inspector>) {
    std::vector<char> bytes;
    if (auto err = f(bytes)) return err;
    try {
      rpc::detail::reader r(bytes.data(), bytes.size(), detail::actor_codec_context(f.context()));
      x = rpc::detail::read_tensor(r);
    } catch (const error& e) {
      const error failure(e.code(), "cannot decode a tensor: " + e.message());
      detail::note_actor_codec_failure(f.context(), failure);
      return to_caf_error(failure);
    } catch (const std::exception& e) {
      const error failure(errc::protocol_violation, std::string("cannot decode a tensor: ") + e.what());
      detail::note_actor_codec_failure(f.context(), failure);
      return to_caf_error(failure);
    }
    return {};
  } else {
    std::string d = "tensor";
    if (x.defined())
      for (auto s : x.sizes()) d += "x" + std::to_string(s);
    return f(caf::meta::type_name("troupe.tensor"), d);
  }
}

/// Announces T (a struct with a CAF `inspect`, tensors allowed inside) for actor messages under
/// `name`. The node announces it to CAF before its actor system starts. Every process of the
/// job must announce the same types under the same names. An unannounced type makes a message
/// fail to decode: a request gets a protocol_violation error naming it. Never blocks.
template <class T>
void add_actor_message_type(node_options& opts, std::string name) {
  opts.actor_setup.push_back([name = std::move(name)](caf::actor_system_config& cfg) { cfg.add_message_type<T>(name); });
}

namespace detail {
void publish_actor(node& n, caf::strong_actor_ptr actor, const std::string& name, const std::set<std::string>& interface);
caf::strong_actor_ptr lookup_actor(node& n, const std::string& worker, const std::string& name, const std::set<std::string>& want,
                                   std::chrono::milliseconds timeout);
}  // namespace detail

/// Publishes a local actor under `name` in the job (the store key troupe/actor/<worker>/<name>),
/// with its typed interface (empty for caf::actor). Publishing a name again replaces it. Blocks
/// on one store round trip. Throws troupe::error: bad_argument (null handle, or an actor of
/// another process), invalid_state (node shut down), peer_lost (store host gone).
template <class Handle>
void publish_actor(node& n, const Handle& actor, const std::string& name) {
  detail::publish_actor(n, caf::actor_cast<caf::strong_actor_ptr>(actor), name, n.system().message_types<Handle>());
}

/// The actor `worker` published under `name`, as a Handle (caf::actor or a caf::typed_actor).
/// Blocks until the name is published or `timeout` passes, and to connect to `worker` the first
/// time. Throws troupe::error naming the worker and the name:
///   * timeout: nothing was published under it in time;
///   * bad_argument: it was published with an interface that does not offer Handle's (the
///     message lists both);
///   * peer_lost: the worker is gone;
///   * invalid_state: the node shut down, or there is no direct channel.
template <class Handle = caf::actor>
Handle lookup_actor(node& n, const std::string& worker, const std::string& name, std::chrono::milliseconds timeout) {
  auto p = detail::lookup_actor(n, worker, name, n.system().message_types<Handle>(), timeout);
  return caf::actor_cast<Handle>(std::move(p));
}

}  // namespace troupe
