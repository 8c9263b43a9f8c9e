#pragma once
// The router of one rref_context (Note [RRef protocol] in rref/context.hpp). It spawns the
// owner_rref / user_rref actors on the node's actor system and keeps id -> actor maps and the
// tombstones. It runs the node's RRef service actor (Note [rref service] in service.cpp). It
// serves the data path's reserved "troupe.rref.*" functions (serve.cpp). It caches the peers'
// service handles the actors send their control messages to. Its mutex guards only the maps;
// no blocking request to an actor is made under it.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <set>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/logger.hpp>
#include <caf/scoped_actor.hpp>

#include "executor.hpp"
#include "owner_rref.hpp"
#include "troupe/actors/rpc/registry.hpp"
#include "troupe/actors/rref/context.hpp"
#include "user_rref.hpp"

namespace troupe::rref_detail {

using fork_key = std::pair<rref_id, fork_id>;

/// context_impl::ask for handlers that never park their answer.
inline constexpr auto answers_at_once = std::chrono::milliseconds::max();

/// CAF 0.17 keeps a strong reference to the actor system's logger in a thread-local. It does so
/// in every thread that spawns an actor or makes a scoped_actor, and ~actor_system waits for it.
/// So a user thread that outlives the node would hang the node's teardown: the destructor waits
/// forever. Foreign threads drop it with this guard after they spawned or asked.
struct logger_release {
  logger_release() = default;
  logger_release(const logger_release&) = delete;
  logger_release& operator=(const logger_release&) = delete;
  ~logger_release() { caf::logger::set_current_actor_system(nullptr); }
};

/// Ids kept for a bounded time (rref_options::tombstone_ttl) to refuse late duplicates.
template <class K>
class tombstones {
 public:
  using clock = std::chrono::steady_clock;
  void add(const K& k, clock::time_point now, std::chrono::milliseconds ttl) {
    if (at_.emplace(k, now + ttl).second) order_.emplace_back(now + ttl, k);
  }
  bool contains(const K& k) const { return at_.count(k) != 0; }
  void purge(clock::time_point now) {
    while (!order_.empty() && order_.front().first <= now) {
      auto it = at_.find(order_.front().second);
      if (it != at_.end() && it->second <= now) at_.erase(it);
      order_.pop_front();
    }
  }
  std::size_t size() const { return at_.size(); }

 private:
  std::map<K, clock::time_point> at_;
  std::deque<std::pair<clock::time_point, K>> order_;
};

/// The router's own actor (courier.cpp). It runs the tombstone sweep timer. It sends the retried
/// child_acks the router sends itself, for RRefs bound on their owner and for refused carriers.
/// It collects the released forks' user_deletes per owner for rref_options::release_window and
/// sends them as one retried message (Note [release batching] in courier.cpp).
struct courier_send {
  std::string to;
  rref_msg::child_ack ack;
};
template <class I> typename I::result_type inspect(I& f, courier_send& x) {
  return f(caf::meta::type_name("troupe.rref.courier_send"), x.to, x.ack);
}
/// A released fork's user_delete for `to` (counted in the router's in_flight_ from the hand-over).
struct courier_delete {
  std::string to;
  rref_msg::user_delete del;
};
template <class I> typename I::result_type inspect(I& f, courier_delete& x) {
  return f(caf::meta::type_name("troupe.rref.courier_delete"), x.to, x.del);
}
/// A batch of user_deletes goes at once when it reaches this many.
constexpr std::size_t max_delete_batch = 512;
/// A released creator or bound fork's release (with its remote_done when the handle carried it),
/// handed over through the router's list (Note [release batching]).
struct handed_release {
  user_rref_actor to;
  std::optional<rref_msg::remote_done> done;  ///< else a release_atom
  void send() const;  ///< to the fork, now
};
/// What the courier takes from the router's lists at once.
struct handover {
  std::vector<courier_delete> deletes;
  std::vector<handed_release> releases;
};
using sweep_atom = caf::atom_constant<caf::atom("rsweep")>;
using flush_atom = caf::atom_constant<caf::atom("rflush")>;
using accepts_atom = caf::atom_constant<caf::atom("raccepts")>;
using handover_atom = caf::atom_constant<caf::atom("rhandover")>;  // take the handed-over deletes and releases
using courier_actor = caf::typed_actor<caf::reacts_to<courier_send>, caf::reacts_to<handover_atom>,
                                       caf::reacts_to<sweep_atom>, caf::reacts_to<flush_atom>,
                                       caf::reacts_to<accepts_atom>,
                                       caf::reacts_to<rref_msg::control_done>,
                                       caf::reacts_to<rref_msg::retry_atom, std::uint64_t>>;

/// What a fetch of an existing value needs: the value (or the function's error), immutable.
struct published_value {
  std::int32_t code = 0;
  std::string message;
  rref_msg::held_ptr value;
};

/// The router's entry of an OwnerRRef (Note [owner_rref actor]). It holds:
///   * its actor: null until something needs it; spawned READY when the function finished
///     first, else PENDING;
///   * whether its user function was started (the remote_call dedupe) and is still RUNNING
///     (deletion refused);
///   * a read-through snapshot of its value, null while the value does not exist. The
///     function's thread or make_rref installs it. The actor replaces it after a method.
///     Deletion revokes it by erasing the entry;
///   * the fetches from other workers, parked until the value exists;
///   * the remote_call's answer while it is withheld (Note [withheld accept] in serve.cpp).
struct owner_entry {
  owner_rref_actor actor;
  bool started = false;
  bool running = false;
  std::shared_ptr<const published_value> snapshot;
  std::vector<std::shared_ptr<rpc::reply_later>> parked;
  std::shared_ptr<rpc::reply_later> accept;
};

/// Answers a fetch's deferred reply with a value or its error. The value is encoded on the
/// calling thread under the fetch's served-call scopes (Note [deferred reply]). So distributed
/// autograd records its send there. The answer goes into `batch` (Note [reply batch]).
void answer_fetch(rpc::reply_later& reply, const published_value& v, rpc::reply_batch& batch);

/// The peers' RRef service handles, looked up once per peer (Note [first contact]) and dropped
/// when the service monitoring them sees them go down. Shared with the first-contact thread's
/// jobs; `closed`: close() ran, no handle is kept.
struct peer_services {
  std::mutex mutex;
  std::map<std::string, caf::actor> handles;
  bool closed = false;
  std::optional<caf::actor> find(const std::string& peer) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = handles.find(peer);
    if (it == handles.end()) return std::nullopt;
    return it->second;
  }
  /// Keeps `h` for `peer`; false when closed or a handle is already kept.
  bool add(const std::string& peer, caf::actor h) {
    std::lock_guard<std::mutex> lock(mutex);
    return !closed && handles.emplace(peer, std::move(h)).second;
  }
  /// Drops the handle of `peer` if it is `h`.
  void drop(const std::string& peer, const caf::actor_addr& h) {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = handles.find(peer);
    if (it != handles.end() && it->second.address() == h) handles.erase(it);
  }
  void close() {
    std::lock_guard<std::mutex> lock(mutex);
    closed = true;
    handles.clear();
  }
};

/// The name the RRef service of every node is published under (Note [rref service]).
inline constexpr const char* service_name = "troupe.rref";
/// The service's own messages: monitor the handle of a peer's service (from the first-contact
/// thread).
using watch_peer_atom = caf::atom_constant<caf::atom("rwatchpeer")>;

class context_impl;
/// Spawns the router's courier.
courier_actor spawn_courier(context_impl& r);
/// Spawns the node's RRef service (Note [rref service] in service.cpp).
caf::actor spawn_service(context_impl& c);
/// Registers the data path's reserved functions, remote_call and fetch (serve.cpp).
void serve_data_path(context_impl& c);
/// Starts remote(): calls `function` on `to` and returns the handle of the rref it creates
/// (remote.cpp).
std::shared_ptr<handle> start_remote(context_impl& c, const std::string& to, const std::string& function,
                                     const std::function<std::vector<char>(const rpc::codec_context&)>& encode, std::chrono::milliseconds timeout);

class context_impl : public std::enable_shared_from_this<context_impl> {
 public:
  context_impl(node& n, rref_options opts);
  ~context_impl();
  void start();  // registers the functions, spawns and publishes the service, spawns the courier
  void close();  // stops every actor; releases become no-ops

  node* n_;
  std::string me_;
  rref_options opts_;
  caf::actor_system* sys_;  // the node's (node::system)
  courier_actor courier_;
  caf::actor service_;  // Note [rref service]

  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  bool closed_ = false;
  std::atomic<std::uint64_t> next_{1};
  std::map<rref_id, owner_entry> owners_;
  std::map<fork_key, user_rref_actor> users_;
  std::map<rref_id, int> local_refs_on_way_;
  std::vector<rref_id> accepts_waiting_;  // withheld remote_call answers (Note [withheld accept])
  bool accepts_armed_ = false;            // the courier's timer for them runs
  // Deleted owners and DELETING forks until their last control message is done. CAF ends an
  // actor nobody references, so the router keeps them until they call actor_done.
  std::map<caf::actor_addr, caf::actor> draining_;  // binds on the owner not yet taken by its actor
  tombstones<rref_id> deleted_owners_;
  tombstones<fork_key> gone_users_;   // forks this node deleted (stale duplicate carriers)
  tombstones<fork_key> owner_bound_;  // forks received by their owner (fork_probe: "received")
  tombstones<fork_key> abandoned_;    // forks probed for before they arrived: refused
  // Note [first contact]: looking up a peer's service blocks (a store round trip, and resolving
  // the peer: connect, hello). Control messages are sent from actor handlers. A scheduler thread
  // blocked there can starve the store client's reply. Two forks' first fork_requests can take
  // both threads of a node; the resolve then times out and the live owner is reported lost. So
  // the lookup runs on this one thread (the node's default timeout). Its end resends the attempt
  // (retry_atom) or fails it. Stopped by close().
  std::shared_ptr<peer_services> peers_ = std::make_shared<peer_services>();
  std::unique_ptr<detail::executor> contact_ = std::make_unique<detail::executor>(1);
  mutable std::mutex lost_mutex_;
  std::set<std::string> lost_;        // peers that answered peer_lost (own mutex: actors read it)
  std::atomic<std::int64_t> in_flight_{0};
  // Note [release batching]: handle releases and the user_deletes of DELETING forks, not yet
  // taken by the courier. `handover_asked_`: the courier will take them without another
  // message, since a handover_atom is on its way or its window timer runs.
  std::mutex handover_mutex_;
  handover handover_;
  bool handover_asked_ = false;
  bool closed_handover_ = false;  // close() ran: releases are dropped (the actors are ended)
  struct counters {
    std::atomic<std::uint64_t> remote_calls{0}, fork_requests{0}, child_acks{0}, user_deletes{0}, fetches{0}, retries{0}, value_readies{0};
  } stats_;

  std::uint64_t next_id() { return next_.fetch_add(1); }
  void mark_lost(const std::string& peer);
  bool is_lost(const std::string& peer) const;
  void in_flight_add(std::int64_t d);

  // --- maps (thread-safe) ---
  /// The owner actor of `id`; spawned PENDING if absent and `create`; nullopt if deleted.
  std::optional<owner_rref_actor> owner_for(const rref_id& id, bool create);
  std::optional<user_rref_actor> user_for(const fork_key& k);
  /// The entry of `id`, with a PENDING owner actor spawned if it has none. Call with mutex_ held.
  owner_entry& entry_for(const rref_id& id);
  /// The entry of `id`, created without an actor if absent. Call with mutex_ held.
  owner_entry& bare_entry(const rref_id& id);
  /// For a remote_call of `id`: whether its user function may run now. true: this call starts
  /// it and the entry is RUNNING; false: a duplicate. nullopt if the id was deleted or we are
  /// closed.
  std::optional<bool> start_owner(const rref_id& id);
  /// The user function of `id` finished (`v`: value or error, creator fork). Publishes the
  /// snapshot and answers the fetches parked in the entry on this thread. Then it answers
  /// `accept`, the remote_call's answer, which is withheld if no fetch was parked
  /// (Note [withheld accept]). Then it hands the value to the owner actor (spawned READY if it
  /// has none).
  void value_done(const rref_id& id, rref_msg::value_set v, std::shared_ptr<rpc::reply_later> accept);
  /// Answers the withheld remote_call answers (the courier, one window after the first).
  void release_accepts();
  /// A fetch of `id` from another worker. If the value exists, it is answered now from the
  /// snapshot; if the id is gone, it fails. Else it is parked in the entry until value_done.
  /// Never blocks.
  void fetch(const rref_id& id, std::shared_ptr<rpc::reply_later> reply);
  /// The owner actor installs the snapshot of its current value (read by later fetches).
  void publish(const rref_id& id, std::shared_ptr<const published_value> v);
  /// The owner actor decided to delete: erases and tombstones it and fails the fetches parked in
  /// its entry. It does not when its function is RUNNING. Nor does it when a bind of the id on
  /// this node sent it a local reference it has not taken yet. Then it returns false: the actor
  /// stays, and value_set / the reference re-checks.
  bool owner_gone(const rref_id& id);
  void local_ref_arrived(const rref_id& id);  // the actor took one of those local references
  void user_gone(const fork_key& k);   // the fork entered DELETING: tombstone
  void actor_done(const caf::actor_addr& a);  // a draining actor quits
  void purge_tombstones();
  std::size_t tombstone_count() const;

  // --- control messages (from actors) ---
  /// The service handle of `to` (this node's own for me_); nullopt until its first contact.
  std::optional<caf::actor> service_of(const std::string& to);
  /// First contact with `to` (Note [first contact]): looks its service up off the actor threads.
  /// Then `who` gets retry_atom{seq} (send it now), or control_done{seq} with the failure.
  void contact(const std::string& to, std::uint64_t seq, caf::actor_addr who);
  /// Hands a released fork's user_delete for `owner` to the courier (G1; batched, retried).
  void send_delete(const std::string& owner, const rref_msg::user_delete& del);
  /// Hands a handle's release (and the remote_done it carries) to fork `u` through the courier.
  /// It arrives one window later (Note [release batching]); at once with release_window 0.
  void hand_release(const user_rref_actor& u, std::optional<rref_msg::remote_done> done);
  /// The courier takes the handed-over deletes, and when `window_over` the releases too (then the
  /// next hand-over asks it again).
  handover take_handover(bool window_over);
  /// Delivers a child_ack (local, or through the courier) for the parent `parent`.
  void send_ack(const std::string& parent, const rref_msg::child_ack& ack);
  /// Routes an inbound child_ack to its parent actor (owner or user fork).
  void deliver_ack(const rref_msg::child_ack& ack);

  // --- blocking requests from user / executor threads (never under mutex_) ---
  /// `timeout` == answers_at_once: the handler answers at once, with no response promise.
  /// So no timer is armed; a dead actor still fails the request at once. Otherwise a bounded
  /// wait.
  template <class R, class Handle, class... Ms>
  std::optional<R> ask(const Handle& a, std::chrono::milliseconds timeout, Ms&&... ms);

 private:
  std::mutex pool_mutex_;
  std::vector<std::unique_ptr<caf::scoped_actor>> pool_;
  std::unique_ptr<caf::scoped_actor> take_scoped();
  void give_scoped(std::unique_ptr<caf::scoped_actor> s);
};

template <class R, class Handle, class... Ms>
std::optional<R> context_impl::ask(const Handle& a, std::chrono::milliseconds timeout, Ms&&... ms) {
  logger_release release;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return std::nullopt;
  }
  auto s = take_scoped();
  std::optional<R> out;
  bool reusable = true;
  auto handle = timeout == answers_at_once ? (*s)->request(a, caf::infinite, std::forward<Ms>(ms)...)
                                            : (*s)->request(a, timeout, std::forward<Ms>(ms)...);
  std::move(handle).receive([&](R& r) { out = std::move(r); },
               [&](caf::error& e) { reusable = e != caf::make_error(caf::sec::request_timeout); });
  if (reusable) give_scoped(std::move(s));  // a timed-out one may still get the late answer
  return out;
}

/// The errc of a failed control request. Troupe errors keep theirs (peer_lost from a lost peer's
/// proxy). A request timeout is a timeout (retried). Anything else is invalid_state, a final
/// failure: the peer's service exited, since its rref context closed.
errc control_failure(const caf::error& e);

/// One attempt of control message `seq`: a request to the service of its peer; the answer or
/// failure comes back to `self` as control_done{seq}.
template <class Self>
void send_attempt(Self* self, control_retries& ctl, context_impl& r, std::uint64_t seq) {
  auto it = ctl.sends.find(seq);
  if (it == ctl.sends.end()) return;
  const auto& p = it->second;
  auto done = [self, seq](errc code, std::int32_t reply) {
    self->send(self, rref_msg::control_done{seq, static_cast<std::int32_t>(code), reply});
  };
  if (r.is_lost(p.to)) return done(errc::peer_lost, 0);
  auto h = r.service_of(p.to);
  if (!h) return r.contact(p.to, seq, self->address());
  self->request(*h, r.opts_.control_attempt_timeout, p.msg)
      .then([done](const rref_msg::answer& a) { done(errc::ok, a.value); },
            [done](const caf::error& e) { done(control_failure(e), 0); });
}

/// Starts a retried control message `msg` to the service of `to` from actor `self`; its state
/// holds `ctl`. `done` gets the answer (errc::ok) or the final failure.
template <class Self, class Msg>
void start_control(Self* self, control_retries& ctl, context_impl& r, std::string to, Msg msg,
                   std::function<void(errc, std::int32_t)> done) {
  const auto seq = ctl.next++;
  auto& p = ctl.sends[seq];
  p.to = std::move(to);
  p.msg = caf::make_message(std::move(msg));
  p.done = std::move(done);
  r.in_flight_add(1);
  send_attempt(self, ctl, r, seq);
}

/// An attempt finished: ends the message (answered or final failure) or arms the retry timer.
template <class Self>
void on_control_done(Self* self, control_retries& ctl, context_impl& r, const rref_msg::control_done& d) {
  auto it = ctl.sends.find(d.seq);
  if (it == ctl.sends.end()) return;
  const auto code = static_cast<errc>(d.code);
  if (code == errc::ok || final_failure(code)) {
    if (code == errc::peer_lost) r.mark_lost(it->second.to);
    auto done = std::move(it->second.done);
    ctl.sends.erase(it);
    r.in_flight_add(-1);
    if (done) done(code, d.reply);
    return;
  }
  ++r.stats_.retries;
  self->delayed_send(self, it->second.backoff, rref_msg::retry_atom::value, d.seq);
  // Doubling up to 200 ms, or up to one attempt timeout when that is shorter (tests).
  it->second.backoff = std::min({it->second.backoff * 2, std::chrono::milliseconds(200), r.opts_.control_attempt_timeout});
}

/// A draining actor asks itself to end once nothing is pending; end() runs on that message.
/// A handler that quits directly may lose the response it is about to send.
template <class Self>
void request_end(Self* self, bool nothing_pending) {
  if (!nothing_pending || self->state.quitting) return;
  self->state.quitting = true;
  self->send(self, rref_msg::done_atom::value);
}
template <class Self>
void end(Self* self) {
  self->state.r->actor_done(self->address());
  self->quit();
}

/// The retry timer of `seq` fired.
template <class Self>
void on_retry(Self* self, control_retries& ctl, context_impl& r, std::uint64_t seq) {
  send_attempt(self, ctl, r, seq);
}

}  // namespace troupe::rref_detail

