// The router of an rref_context: its actor system, the id -> actor maps, tombstones and the
// peers' service handles (Note [RRef protocol]). The courier is in courier.cpp.
#include <sstream>

#include <caf/all.hpp>

#include "context_impl.hpp"
#include "troupe/actors/rpc/reply_batch.hpp"
#include "troupe/actors/remote_actor.hpp"
#include "troupe/actors/rpc/api.hpp"

namespace troupe::rref_detail {

namespace {

// Moves an actor from its map to the draining set (it ends itself later, actor_done).
template <class Map, class Key>
void retire(Map& m, const Key& k, std::map<caf::actor_addr, caf::actor>& draining) {
  auto it = m.find(k);
  if (it == m.end()) return;
  draining.emplace(it->second.address(), caf::actor_cast<caf::actor>(it->second));
  m.erase(it);
}

void deliver(const caf::actor_addr& who, rref_msg::control_done d) {
  if (auto p = caf::actor_cast<caf::strong_actor_ptr>(who)) caf::anon_send(caf::actor_cast<caf::actor>(p), std::move(d));
}

}  // namespace

context_impl::context_impl(node& n, rref_options opts) : n_(&n), me_(n.info().name), opts_(opts) {
  if (opts_.result_probe_after.count() <= 0) opts_.result_probe_after = 3 * n.default_timeout();
  if (opts_.tombstone_ttl.count() <= 0) opts_.tombstone_ttl = std::chrono::seconds(30);
  if (opts_.control_attempt_timeout.count() <= 0) opts_.control_attempt_timeout = std::chrono::milliseconds(500);
  sys_ = &n.system();
}

context_impl::~context_impl() { close(); }

void context_impl::close() {
  std::vector<caf::actor> all;
  std::vector<std::shared_ptr<rpc::reply_later>> parked;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    closed_ = true;
    for (auto& [id, e] : owners_) {
      if (e.actor) all.push_back(caf::actor_cast<caf::actor>(e.actor));
      parked.insert(parked.end(), e.parked.begin(), e.parked.end());
      if (e.accept) parked.push_back(e.accept);
    }
    for (auto& [k, a] : users_) all.push_back(caf::actor_cast<caf::actor>(a));
    for (auto& [addr, a] : draining_) all.push_back(a);
    owners_.clear();
    users_.clear();
    draining_.clear();
  }
  changed_.notify_all();
  for (auto& reply : parked) reply->fail(errc::invalid_state, "the rref context of " + me_ + " closed");
  {
    // The handed-over releases hold their actors, whose state holds this router: drop them.
    std::lock_guard<std::mutex> lock(handover_mutex_);
    closed_handover_ = true;
    handover_ = {};
  }
  for (auto& a : all) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  if (courier_) caf::anon_send_exit(courier_, caf::exit_reason::user_shutdown);
  if (service_) caf::anon_send_exit(service_, caf::exit_reason::user_shutdown);
  peers_->close();   // the proxies go before the system; a lookup that ends later keeps nothing
  contact_->stop();  // waits for a first contact in progress (bounded by the node's default timeout)
  std::lock_guard<std::mutex> lock(pool_mutex_);
  pool_.clear();  // before the node's system goes
}

void context_impl::mark_lost(const std::string& peer) {
  std::lock_guard<std::mutex> lock(lost_mutex_);
  lost_.insert(peer);
}

bool context_impl::is_lost(const std::string& peer) const {
  std::lock_guard<std::mutex> lock(lost_mutex_);
  return lost_.count(peer) != 0;
}

void context_impl::in_flight_add(std::int64_t d) {
  if (in_flight_.fetch_add(d) + d == 0) {
    std::lock_guard<std::mutex> lock(mutex_);  // pairs with wait_quiescent's predicate check
    changed_.notify_all();
  }
}

std::optional<owner_rref_actor> context_impl::owner_for(const rref_id& id, bool create) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_ || deleted_owners_.contains(id)) return std::nullopt;
  if (!create && !owners_.count(id)) return std::nullopt;
  return entry_for(id).actor;  // an entry without an actor yet (function running) gets a PENDING one
}

owner_entry& context_impl::bare_entry(const rref_id& id) { return owners_[id]; }

owner_entry& context_impl::entry_for(const rref_id& id) {
  auto& e = bare_entry(id);
  if (!e.actor) e.actor = spawn_owner_rref(*this, id, owner_start{});  // PENDING
  return e;
}

std::optional<bool> context_impl::start_owner(const rref_id& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_ || deleted_owners_.contains(id)) return std::nullopt;
  auto& e = bare_entry(id);  // no actor yet: value_done spawns it READY unless something needs it first
  if (e.started) return false;
  e.started = e.running = true;
  return true;
}

void context_impl::value_done(const rref_id& id, rref_msg::value_set v, std::shared_ptr<rpc::reply_later> accept) {
  auto published = std::make_shared<const published_value>(published_value{v.code, v.message, v.value});
  std::vector<std::shared_ptr<rpc::reply_later>> parked;
  bool arm = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = owners_.find(id);  // present: deletion is refused while RUNNING
    if (closed_ || it == owners_.end()) return;
    it->second.snapshot = published;
    parked.swap(it->second.parked);
    if (parked.empty() && opts_.release_window.count() > 0) {  // Note [withheld accept]
      it->second.accept = std::move(accept);
      accepts_waiting_.push_back(id);
      arm = !std::exchange(accepts_armed_, true);
    }
  }
  // Answered on this thread before anything else (encoded under each fetch's served-call scopes),
  // in one write per caller (Note [reply batch]).
  {
    rpc::reply_batch together;
    for (auto& reply : parked) answer_fetch(*reply, *published, together);
    if (accept) accept->complete<bool>(true, together);
  }
  if (arm) caf::delayed_anon_send(courier_, opts_.release_window, accepts_atom::value);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = owners_.find(id);
    if (closed_ || it == owners_.end()) return;
    auto& e = it->second;
    e.running = false;
    if (!e.actor) {
      e.actor = spawn_owner_rref(*this, id, owner_start{true, v.code, std::move(v.message), std::move(v.value), 0, v.fork});
      return;
    }
    caf::anon_send(e.actor, std::move(v));  // a PENDING actor: READY now, and it may delete
  }
}

void context_impl::fetch(const rref_id& id, std::shared_ptr<rpc::reply_later> reply) {
  std::shared_ptr<const published_value> v;
  std::shared_ptr<rpc::reply_later> accept;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!closed_ && !deleted_owners_.contains(id)) {
      auto& e = bare_entry(id);  // a fetch may overtake the remote_call that creates the value
      if (!e.snapshot) return e.parked.push_back(std::move(reply));  // answered by value_done
      v = e.snapshot;
      accept = std::move(e.accept);
    }
  }
  if (v) {
    rpc::reply_batch together;  // one write: the creator reads both with one wake-up (Note [reply batch])
    answer_fetch(*reply, *v, together);  // existing value: answered here, no actor hop
    if (accept) accept->complete<bool>(true, together);  // the withheld answer follows the value
    return;
  }
  reply->fail(errc::invalid_state, "rref " + id.str() + " was deleted by its owner " + me_);
}

void context_impl::release_accepts() {
  std::vector<std::shared_ptr<rpc::reply_later>> due;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    accepts_armed_ = false;
    for (const auto& id : accepts_waiting_) {
      auto it = owners_.find(id);
      if (it != owners_.end() && it->second.accept) due.push_back(std::move(it->second.accept));
    }
    accepts_waiting_.clear();
  }
  for (auto& a : due) a->complete<bool>(true);
}

void context_impl::publish(const rref_id& id, std::shared_ptr<const published_value> v) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = owners_.find(id);
  if (it != owners_.end()) it->second.snapshot = std::move(v);
}

void answer_fetch(rpc::reply_later& reply, const published_value& v, rpc::reply_batch& batch) {
  if (v.code != 0) return reply.fail(static_cast<errc>(v.code), v.message, &batch);
  const auto& value = v.value;
  reply.complete_encoded(
      [&value](const rpc::codec_context& ctx) {
        rpc::codec_context stored = ctx;
        stored.stored = true;  // an rref inside a stored value is refused (Note [RRef protocol])
        return value->encode(stored);
      },
      &batch);
}

std::optional<user_rref_actor> context_impl::user_for(const fork_key& k) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = users_.find(k);
  if (it == users_.end()) return std::nullopt;
  return it->second;
}

bool context_impl::owner_gone(const rref_id& id) {
  std::vector<std::shared_ptr<rpc::reply_later>> parked;
  std::shared_ptr<rpc::reply_later> accept;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (local_refs_on_way_.count(id)) return false;
    auto it = owners_.find(id);  // revokes the snapshot with the entry
    if (it != owners_.end()) {
      if (it->second.running) return false;  // its value_set comes, then the actor re-checks
      draining_.emplace(it->second.actor.address(), caf::actor_cast<caf::actor>(it->second.actor));
      parked.swap(it->second.parked);
      accept = std::move(it->second.accept);
      owners_.erase(it);
    }
    deleted_owners_.add(id, std::chrono::steady_clock::now(), opts_.tombstone_ttl);  // refuses later copies of its remote_call
  }
  changed_.notify_all();
  for (auto& reply : parked) reply->fail(errc::invalid_state, "rref " + id.str() + " was deleted by its owner " + me_);
  if (accept) accept->complete<bool>(true);  // its function ran: accepted, as if answered at once
  return true;
}

void context_impl::local_ref_arrived(const rref_id& id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = local_refs_on_way_.find(id);
  if (it != local_refs_on_way_.end() && --it->second == 0) local_refs_on_way_.erase(it);
}

void context_impl::user_gone(const fork_key& k) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    retire(users_, k, draining_);
    gone_users_.add(k, std::chrono::steady_clock::now(), opts_.tombstone_ttl);
  }
  changed_.notify_all();
}

void context_impl::actor_done(const caf::actor_addr& a) {
  std::lock_guard<std::mutex> lock(mutex_);
  draining_.erase(a);
}

void context_impl::purge_tombstones() {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = std::chrono::steady_clock::now();
  deleted_owners_.purge(now);
  gone_users_.purge(now);
  owner_bound_.purge(now);
  abandoned_.purge(now);
}

std::size_t context_impl::tombstone_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return deleted_owners_.size() + gone_users_.size() + owner_bound_.size() + abandoned_.size();
}

std::optional<caf::actor> context_impl::service_of(const std::string& to) {
  if (to == me_) return service_;
  return peers_->find(to);
}

void context_impl::contact(const std::string& to, std::uint64_t seq, caf::actor_addr who) {
  // The job holds no reference to this context (close() joins the thread before the node may go).
  auto job = [n = n_, peers = peers_, service = service_, to, seq, who]() {
    if (!peers->find(to)) {
      try {
        auto h = caf::actor_cast<caf::actor>(detail::lookup_actor(*n, to, service_name, {}, n->default_timeout()));
        if (peers->add(to, h)) caf::anon_send(service, watch_peer_atom::value, to, h);
      } catch (const error& e) {
        // A lost or unknown peer ends the message; a timeout (nothing published yet, a slow
        // store) is retried with backoff like a lost attempt.
        const auto code = e.code() == errc::timeout ? errc::timeout : e.code() == errc::peer_lost ? errc::peer_lost : errc::invalid_state;
        return deliver(who, rref_msg::control_done{seq, static_cast<std::int32_t>(code), 0});
      }
    }
    if (auto p = caf::actor_cast<caf::strong_actor_ptr>(who))
      caf::anon_send(caf::actor_cast<caf::actor>(p), rref_msg::retry_atom::value, seq);
  };
  if (!contact_->post(std::move(job)))
    deliver(who, rref_msg::control_done{seq, static_cast<std::int32_t>(errc::invalid_state), 0});
}

void context_impl::send_delete(const std::string& owner, const rref_msg::user_delete& del) {
  in_flight_add(1);  // until the courier sends it (then its retried batch counts)
  bool ask = false;
  {
    std::lock_guard<std::mutex> lock(handover_mutex_);
    handover_.deletes.push_back(courier_delete{owner, del});
    // One message per window, not per delete: each would schedule the courier. One more goes
    // when a batch is full or nothing is batched (release_window 0).
    ask = !handover_asked_ || handover_.deletes.size() == max_delete_batch || opts_.release_window.count() <= 0;
    handover_asked_ = true;
  }
  if (ask) caf::anon_send(courier_, handover_atom::value);
}

void handed_release::send() const {
  if (done) caf::anon_send(to, *done);
  else caf::anon_send(to, rref_msg::release_atom::value);
}

void context_impl::hand_release(const user_rref_actor& u, std::optional<rref_msg::remote_done> done) {
  handed_release r{u, std::move(done)};
  if (opts_.release_window.count() <= 0) return r.send();
  bool ask = false;
  {
    std::lock_guard<std::mutex> lock(handover_mutex_);
    if (closed_handover_) return;  // close() ended the actors
    handover_.releases.push_back(std::move(r));
    ask = !handover_asked_;
    handover_asked_ = true;
  }
  if (ask) caf::anon_send(courier_, handover_atom::value);
}

handover context_impl::take_handover(bool window_over) {
  std::lock_guard<std::mutex> lock(handover_mutex_);
  if (!window_over) return handover{std::exchange(handover_.deletes, {}), {}};  // releases wait for the window's end
  handover_asked_ = false;
  return std::exchange(handover_, {});
}

void context_impl::send_ack(const std::string& parent, const rref_msg::child_ack& ack) {
  if (parent == me_) return deliver_ack(ack);
  ++stats_.child_acks;
  caf::anon_send(courier_, courier_send{parent, ack});
}

void context_impl::deliver_ack(const rref_msg::child_ack& ack) {
  if (ack.parent_fork.empty()) {
    if (auto a = owner_for(ack.id, false)) caf::anon_send(*a, ack);
  } else if (auto u = user_for({ack.id, ack.parent_fork})) {
    caf::anon_send(*u, ack);
  }  // else: a duplicate ack for a parent already gone
}

std::unique_ptr<caf::scoped_actor> context_impl::take_scoped() {
  {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (!pool_.empty()) {
      auto s = std::move(pool_.back());
      pool_.pop_back();
      return s;
    }
  }
  return std::make_unique<caf::scoped_actor>(*sys_);
}

void context_impl::give_scoped(std::unique_ptr<caf::scoped_actor> s) {
  std::lock_guard<std::mutex> lock(pool_mutex_);
  if (pool_.size() < 16) pool_.push_back(std::move(s));
}

void context_impl::start() {
  serve_data_path(*this);
  service_ = spawn_service(*this);  // Note [rref service]
  courier_ = spawn_courier(*this);
  detail::publish_actor(*n_, caf::actor_cast<caf::strong_actor_ptr>(service_), service_name, {});
}

}  // namespace troupe::rref_detail
