#pragma once
/// \file context.hpp
/// The RRef context of one node: the OwnerRRefs it owns and the UserRRef forks it holds.
/// It also holds the retried control messages between them (Note [RRef protocol]).
///
/// Note [RRef protocol]
///
/// Ids: rref_id{creator, counter}; fork_id{creator, counter}. The creator's own fork of an RRef
/// made by remote() has the same numbers as the RRef id (its "creator fork").
///
/// Actors (actors/src/rref/): one owner_rref actor per OwnerRRef (Note [owner_rref actor]).
/// One user_rref actor per UserRRef fork a node holds (Note [user_rref actor]). Both run on the
/// context's actor system.
/// The context is a router. It keeps id -> actor maps and tombstones. It runs the node's RRef
/// service actor, published as "troupe.rref". The service receives other nodes' control
/// messages and delivers each to the actor it names. The router also serves the data path's
/// reserved RPC functions "troupe.rref.remote_call" and "troupe.rref.fetch".
/// The owner actor owns its value. The router's entry of the id keeps only a read-through
/// snapshot, which the actor installs and revokes. So a fetch of an existing value needs no
/// actor hop, nor does one that parks before the value exists (Note [owner_rref actor]).
/// User functions and methods run on the node's executor, never in an actor. No executor thread
/// waits for a value.
///
/// Messages are typed structs with inspect() (actors/src/rref/protocol.hpp).
/// remote_call is the user call. It is never retried, and the router deduplicates it by id.
/// fork_request goes child -> owner. Its reply is the owner's accept, which the owner actor
/// gives through a deferred reply. child_ack goes child -> parent, user_delete user -> owner.
/// fork_probe goes from the sender to the receiver of a lost carrier. fetch is to_here: a
/// deferred reply, answered once the value exists.
/// Across processes the control messages (fork_request, child_ack, user_delete_batch,
/// fork_probe) are remote actor requests. They go from the sending actor to the peer's service,
/// which answers with an `answer` (Note [rref service] in actors/src/rref/service.cpp).
/// remote_call and fetch are the CAF-serialised single argument of their reserved function,
/// sent through node::call (Note [rref data path] in serve.cpp).
/// The transport hook, the fault plan and peer loss see every one. They see the control
/// messages as "actor:troupe.rref.<message>".
/// Control messages are idempotent. Their actor resends each with backoff until answered:
/// request timeouts start at 5 ms and double to 200 ms. rref_options::control_attempt_timeout
/// bounds each attempt. A final failure (peer_lost, refused) ends them. A lost peer fails the
/// control messages in flight to it at once. No order is assumed between any two messages.
///
///   owner_rref:  PENDING --remote_call--> RUNNING --value published--> READY(value | error)
///                PENDING|READY --nothing refers to it--> DELETED (tombstone) --> quits
///   user_rref:   UNCONFIRMED --remote reply | fork_request accept--> CONFIRMED --> acks parents
///                UNCONFIRMED --refused / owner lost--> FAILED --> acks parents
///                CONFIRMED|FAILED, holds == 0 --> DELETING (tombstone; user_delete if CONFIRMED)
///                DELETING, no control message pending --> quits
///   holds = live handles + children this fork passed on whose child_ack is still missing
///
/// G2: a fork that passes itself on keeps a hold (token) until the child's child_ack. A child
/// acks only once the owner confirmed it. So the owner always knows a live fork before its
/// parent can be deleted. G1: a fork sends its user_delete only once it is confirmed and
/// holds == 0. The owner's local handles and its own pending children count as local refs.
///
///   creator A         owner O          child B
///   remote() ---remote_call(id,F0)--->  (run fn on executor)
///   <----------- reply (confirm F0) --  (withheld until the first fetch's answer or the
///                                        courier's window: Note [withheld accept])
///   call(B, rref) ----(wire: id,F1,parent A,token)----------------> bind (user_rref F1)
///                                   <---fork_request(id,F1)-------
///                                    ---accept------------------->
///   <------------------------------------------child_ack(token)---
///   release ---user_delete(id,F0)-->                 release   (batched per owner:
///                                                               Note [release batching])
///                                   <---user_delete(id,F1)--------   -> O deletes
///   to_here before the value:  ---fetch--> parked in the router's entry (a deferred reply)
///                              <--value (answered by the thread that ran the function)--
///   to_here after the value:   ---fetch--> answered from the published snapshot
///
/// Values: the owner keeps the live object that the function, make_rref or a method gave
/// (rpc::held_value), never bytes. A fetch's answer is that object, encoded when the fetch is
/// answered. The answering thread encodes it under the fetch's served-call scopes. The user
/// decodes it through the rpc future under its call's scope. So the interceptor (distributed
/// autograd) sees the tensors of to_here like those of any RPC: a send on the owner, a recv on
/// the user. The remote_call's own response carries no tensor. On the owner, to_here and
/// local_value return the live object itself (a tensor is the same tensor). A method works on a
/// copy that replaces it.
///
/// Fails: a user function that throws makes fetch fail with remote_exception (text).
/// A dead owner makes fetch and method calls fail with owner_lost naming it. This is the
/// runtime's peer-loss bound: a parked to_here is a pending call, failed with peer_lost when the
/// owner goes. A fetch that finds a deleted id fails with invalid_state ("deleted by its owner").
/// The chaos test asserts this never happens to a live UserRRef.
/// Lost carriers: a call made through the context (rpc_sync/rpc_async/remote) may carry RRefs.
/// When it fails, the sender's actor sends fork_probe(id, fork) (retried) to the callee for each.
/// The callee answers "received" (its child_ack will come) or "not received". After "not
/// received" it refuses that fork, so a late copy of the call binds a failed rref. Then the
/// sender drops its hold. Duplicated carriers are deduplicated by fork id.
/// Results: an RRef sent inside a result is probed the same way. The served call's codec
/// context names its caller (reply_to). The probe goes once rref_options::result_probe_after
/// has passed without the RRef's child_ack. This covers a lost reply and the discarded extra
/// reply of a duplicated request. Cost: a caller that takes such a result later than that finds
/// the RRef refused (invalid_state, "gave the call up").
/// In payloads: an RRef writes and reads itself under the codec context of its encode or decode
/// (Note [codec context]), never under thread state. The context's handle scope says what to do:
///   * a send_scope (the arguments of a call through the context) collects the forks it creates,
///     for the probe above;
///   * a binding_scope (a result taken through the context, to_here, remote's arguments) binds a
///     received RRef to its context. Without one it stays unbound until bind_to (add_function);
///   * a stored value (codec_context::stored: remote's result, make_rref, a method's object)
///     refuses an RRef with not_supported, since stored bytes go to every fetcher.
/// An RRef inside a Boost-serialized user struct is refused (its archive has no context).
/// Tombstones (deleted ids, released / received / abandoned forks) are freed after
/// rref_options::tombstone_ttl, which must exceed the longest transit of a message copy.
/// Assumes: one rref_context per node, destroyed before its node.

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "troupe/actors/node.hpp"
#include "troupe/actors/rpc/future.hpp"
#include "troupe/actors/rpc/registry.hpp"
#include "troupe/actors/rref/ids.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe {

namespace rref_detail {

class context_impl;

/// One reference held by this process; copies of an rref share it. Bound handles release their
/// fork (or local ref) on destruction; an unbound one (decoded with no context) does nothing.
struct handle {
  std::shared_ptr<context_impl> ctx;
  rref_id id;
  std::string owner;
  fork_id fork;            ///< empty on the owner
  bool owner_local = false;
  bool bound = false;
  std::unique_ptr<rref_msg::wire> pending;  ///< what arrived, while unbound (else null: most handles)
  errc failed = errc::ok;  ///< set when the handle can never be used (stale duplicate)
  std::string failure;
  /// remote() without rrefs among its arguments: attaches the remote_call's continuation (the
  /// creator fork's confirmation). watch_remote() runs it once: when the handle is passed on,
  /// asked whether confirmed, fails in to_here, or is released. Attached at once, it would wake
  /// the node's I/O thread to read that answer, which the creator blocked in to_here reads
  /// itself (Note [withheld accept]). Run by a successful to_here, it would schedule the fork's
  /// actor twice, for remote_done and for the release, instead of once for both.
  /// Its argument says the handle is being released. When the call is complete already, the
  /// release goes in the same message and it returns true (one scheduling of the fork's actor).
  mutable std::function<bool(bool release)> watch;
  mutable std::once_flag watch_once;
  handle() = default;
  handle(const handle&) = delete;
  handle& operator=(const handle&) = delete;
  ~handle();
};

/// The codec context of a value encoded to be kept, not sent: RRefs inside it are refused.
inline constexpr rpc::codec_context stored_context{.stored = true};

/// The handle scope of a decode whose RRefs bind to `ctx` (set by rref_context's wrappers; Note
/// [codec context]). Without one, a received RRef stays unbound until bind_to.
class binding_scope final : public rpc::handle_scope {
 public:
  explicit binding_scope(context_impl* ctx) : ctx_(ctx) {}
  context_impl* context() const { return ctx_; }

 private:
  context_impl* ctx_;
};

/// The handle scope of a call's arguments. It collects the forks that the RRefs encoded under
/// it create, for a call to `to`. If the call fails, probe() asks `to` whether it received them
/// (Note [RRef protocol], lost carriers). Used by one encode at a time.
class send_scope final : public rpc::handle_scope {
 public:
  struct sent {
    rref_id id;
    fork_id fork;
    std::uint64_t token = 0;
    fork_id parent_fork;  ///< the sender's own fork (empty on the owner)
  };
  send_scope() = default;
  send_scope(const send_scope&) = delete;
  send_scope& operator=(const send_scope&) = delete;
  /// Returns what was sent and forgets it.
  std::vector<sent> take() { return std::move(sent_); }
  void add(sent s) { sent_.push_back(std::move(s)); }

 private:
  std::vector<sent> sent_;
};

/// After a failed call to `to` that carried `forks`: probes `to` for each (retried) and drops the
/// parent's hold for every fork `to` never received. Never blocks.
void probe(context_impl& ctx, const std::string& to, std::vector<send_scope::sent> forks);

/// Operations the rref<T> templates use (thread-safe; block only where stated).
/// Passes `h` on in a payload encoded under `ctx`: its send_scope (if any) collects the fork;
/// ctx.reply_to names where a result goes. Throws invalid_state (unbound, deleted), and
/// not_supported in a stored value (ctx.stored).
rref_msg::wire fork_for_send(const handle& h, const rpc::codec_context& ctx);
std::shared_ptr<handle> bind(context_impl& ctx, const rref_msg::wire& w);
/// to_here off the owner: the fetch call, once answered with the value (decode it with
/// rpc::future<T>, under the call's interceptor scope). Blocks up to `timeout`; throws timeout,
/// owner_lost, remote_exception, invalid_state.
std::shared_ptr<rpc::detail::call_state> fetch_call(const handle& h, std::chrono::milliseconds timeout);
/// The live value on the owner. `wait` (owner-local to_here) waits up to `timeout` for it.
/// local_value does not wait: invalid_state while it does not exist, or off the owner.
std::shared_ptr<const rpc::held_value> held_here(const handle& h, std::chrono::milliseconds timeout, bool wait);
bool confirmed(const handle& h);
node& node_of(const handle& h);
/// rref_context::remote on the implementation (for rref<T>::remote). `encode` writes the
/// function's arguments; it runs inside node::call (so the call interceptor sees their tensors).
std::shared_ptr<handle> start_remote(context_impl& ctx, const std::string& to, const std::string& function,
                                     const std::function<std::vector<char>(const rpc::codec_context&)>& encode, std::chrono::milliseconds timeout);
/// Throws owner_lost if the owner of `h` is known dead (a peer_lost seen by this context).
void check_owner(const handle& h, const char* op);
/// Runs h.watch once (see handle::watch); any thread, never blocks.
void watch_remote(const handle& h);
/// Remembers that the owner of `h` is dead.
void note_owner_lost(const handle& h);

}  // namespace rref_detail

/// Counters of one context (control messages include retries). fetches counts the fetches this
/// node answered as owner (parked ones too); the others count what this node sent.
struct rref_stats {
  std::uint64_t remote_calls = 0, fork_requests = 0, child_acks = 0, user_deletes = 0, fetches = 0, retries = 0;
  std::uint64_t value_readies = 0;  ///< always 0 now (the fetch is a deferred reply); kept for users of the struct
};

/// Settings of an rref_context.
struct rref_options {
  /// How long an RRef sent inside a result may stay unacknowledged before its sender probes the
  /// caller. That covers a lost reply, or the discarded extra reply of a duplicated request. A
  /// caller that takes the result later than this finds the RRef refused. 0: three times the
  /// node's default timeout.
  std::chrono::milliseconds result_probe_after{0};
  /// How long the ids of deleted OwnerRRefs and released / probed forks are kept to refuse late
  /// duplicates of their messages. Must exceed the longest time a copy of a control message can
  /// stay in transit (one attempt, control_attempt_timeout, plus any injected delay). 0: 30 s.
  std::chrono::milliseconds tombstone_ttl{0};
  /// How long one attempt of a control message may take before it is resent (with backoff).
  /// 0: 500 ms. Tests that inject many losses lower it; it must stay well above a round trip.
  std::chrono::milliseconds control_attempt_timeout{0};
  /// How long the user_deletes of forks released on this node are collected per owner before
  /// they go as one message. This means fewer messages and wake-ups; the owner deletes up to
  /// this much later. 0: each goes at once, in its own message.
  std::chrono::microseconds release_window{1000};
};

/// The RRef context of one node. Construct it after the node and destroy it before. It
/// registers the data path's reserved "troupe.rref.*" functions on the node. It publishes its
/// service actor as "troupe.rref". Thread-safe.
class rref_context {
 public:
  /// Registers the protocol's functions on `n` and publishes its service (one store round trip).
  /// Throws troupe::error when the store cannot be reached.
  explicit rref_context(node& n, rref_options opts = {});
  /// Stops retries; later releases of handles are no-ops. Never throws.
  ~rref_context();
  rref_context(const rref_context&) = delete;
  rref_context& operator=(const rref_context&) = delete;

  /// The node.
  node& this_node();
  /// This worker's name.
  const std::string& name() const;

  /// Starts `function(args)` on `to` as the value of a new RRef; returns its handle at once.
  /// `encode` writes the arguments (inside node::call); RRefs among them are probed if the call
  /// fails. Throws what `encode` throws (nothing is sent then) and invalid_state once closed.
  std::shared_ptr<rref_detail::handle> remote(const std::string& to, const std::string& function,
                                              const std::function<std::vector<char>(const rpc::codec_context&)>& encode, std::chrono::milliseconds timeout);
  /// A new RRef owned here holding the live `value` (Note [owner_rref actor]).
  std::shared_ptr<rref_detail::handle> make_local(std::shared_ptr<const rpc::held_value> value);
  /// A new RRef owned here holding the encoded `value` (encode_result<T> bytes).
  std::shared_ptr<rref_detail::handle> make_local(std::vector<char> value);
  /// Runs `fn` on the owner-local value of `id` on the calling thread. It holds the owner
  /// actor's lease on the value meanwhile: one method at a time. The lease request parks in the
  /// actor until the value exists, up to `timeout`. Blocks the calling (executor) thread while
  /// parked. Throws timeout, remote_exception, invalid_state.
  /// Kept for byte-level users: `fn` gets the value encoded (no interceptor scope). Bytes it
  /// changes replace the value (then held as bytes); unchanged bytes keep the live object.
  void with_value(const rref_id& id, std::chrono::milliseconds timeout, const std::function<void(std::vector<char>&)>& fn);
  /// Like with_value on the live value: `fn` may replace the pointer with a new value. It must
  /// never change the object it points to: fetches may be encoding it. Blocks like with_value.
  void with_held(const rref_id& id, std::chrono::milliseconds timeout,
                 const std::function<void(std::shared_ptr<const rpc::held_value>&)>& fn);

  /// OwnerRRefs this node holds now.
  std::size_t owner_count() const;
  /// UserRRef forks this node holds now (including ones waiting to send their delete).
  std::size_t user_count() const;
  /// Control messages still being retried (and remote_calls not yet answered).
  std::size_t in_flight() const;
  /// Tombstones held now (deleted owners, released / received / abandoned forks); each is freed
  /// rref_options::tombstone_ttl after it was made (swept every ttl / 2).
  std::size_t tombstone_count() const;
  /// Ids of everything still alive here ("owner worker0#3 forks {worker1/4}", "user ...").
  std::vector<std::string> leaks() const;
  /// Blocks until this node holds no user fork, no control message is in flight and, if
  /// `owners_too`, no OwnerRRef. Returns whether that happened within `timeout`.
  bool wait_quiescent(std::chrono::milliseconds timeout, bool owners_too) const;
  /// Graceful end: waits like wait_quiescent(timeout, true); throws errc::timeout listing
  /// leaks() if anything is still alive.
  void shutdown(std::chrono::milliseconds timeout);
  /// Message counters.
  rref_stats stats() const;

  /// The implementation (for rref_detail and the templates).
  rref_detail::context_impl& impl() { return *impl_; }
  /// The implementation, shared (handles and wrappers keep it alive).
  std::shared_ptr<rref_detail::context_impl> shared_impl() const { return impl_; }

 private:
  std::shared_ptr<rref_detail::context_impl> impl_;
};

}  // namespace troupe
