#pragma once
// The state of one rref_context (Note [RRef protocol] in rref/context.hpp): the owner table, the
// fork table and the retry timer. One mutex guards both tables; no RPC is started under it.

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "troupe/actors/rref/context.hpp"

namespace troupe::rref_detail {

/// One OwnerRRef.
struct owner_entry {
  bool started = false;  // remote_call arrived (or make_rref)
  bool ready = false;    // value or error present
  bool creator_fork_deleted = false;
  errc code = errc::ok;
  std::string message;
  std::vector<char> value;
  std::set<fork_id> forks;
  std::set<std::uint64_t> children;  // pending-child tokens of the owner's own sends
  int local = 0;                     // owner-local handles
};

/// One UserRRef fork held here.
struct user_entry {
  std::string owner;
  bool confirmed = false;
  bool delete_sent = false;
  errc failed = errc::ok;  // owner_lost / invalid_state when the owner refused or died
  std::string failure;
  int holds = 0;
  std::set<std::uint64_t> children;
  std::vector<std::pair<std::string, std::uint64_t>> acks;  // (parent, token) to ack once confirmed
};

using fork_key = std::pair<rref_id, fork_id>;
/// The answer to a fetch: (errc, message, encoded value).
using fetch_reply = std::tuple<std::int32_t, std::string, std::vector<char>>;

class context_impl : public std::enable_shared_from_this<context_impl> {
 public:
  context_impl(node& n, rref_options opts);
  ~context_impl();
  void start();  // registers the functions (needs shared_from_this)
  void close();  // stops the timer; releases become no-ops

  node* n_;
  std::string me_;
  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  bool closed_ = false;
  std::uint64_t next_ = 1;
  std::map<rref_id, owner_entry> owners_;
  std::set<rref_id> deleted_owners_;
  std::set<fork_key> deleted_forks_;  // on the owner: forks already deleted
  std::map<fork_key, user_entry> users_;
  std::set<fork_key> gone_users_;     // on a user: forks it already deleted
  std::set<fork_key> owner_bound_;    // on the owner: forks received (and turned into local refs)
  std::set<fork_key> abandoned_;      // forks a parent probed for before they arrived: refused
  std::map<std::uint64_t, fork_key> tokens_;  // pending-child token -> fork holding it (empty fork: owner)
  std::size_t in_flight_ = 0;
  std::chrono::milliseconds result_probe_after_;
  std::set<std::string> lost_;  // peers that answered peer_lost: later calls fail at once
  rref_stats stats_;

  void mark_lost(const std::string& peer) {
    std::lock_guard<std::mutex> lock(mutex_);
    lost_.insert(peer);
  }
  bool is_lost(const std::string& peer) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return lost_.count(peer) != 0;
  }

  // --- timer (retries) ---
  std::multimap<std::chrono::steady_clock::time_point, std::function<void()>> timers_;
  std::thread timer_thread_;
  void timer_loop();
  void after(std::chrono::milliseconds d, std::function<void()> fn);

  // --- control messages (Note [RRef protocol]) ---
  /// Sends `fn(arg)` to `to` until answered; `done(code, reply)` runs once (executor thread).
  template <class Msg>
  void send_control(const std::string& to, const std::string& fn, const Msg& m, std::function<void(errc, std::vector<char>)> done);
  void send_encoded(const std::string& to, const std::string& fn, std::vector<char> payload,
                    std::function<void(errc, std::vector<char>)> done, std::chrono::milliseconds backoff);

  // --- owner side (owner.cpp) ---
  std::int32_t on_fork_request(const rref_msg::fork_request& m);
  bool on_remote_call(const rref_msg::remote_call& m);
  std::int32_t on_user_delete(const rref_msg::user_delete& m);
  fetch_reply on_fetch(const rref_msg::fetch& m);
  void maybe_delete_owner(const rref_id& id);  // under mutex_
  owner_entry* owner_for(const rref_id& id);   // creates a PENDING entry; nullptr if deleted; under mutex_

  // --- user side (user.cpp) ---
  std::int32_t on_child_ack(const rref_msg::child_ack& m);
  std::int32_t on_fork_probe(const rref_msg::fork_probe& m);
  void confirm(const fork_key& k, errc failed, const std::string& why);
  void release_fork(const fork_key& k);           // one hold less
  void release_token(std::uint64_t token);        // a child acked
  void send_fork_request(const fork_key& k);
  void send_ack(const std::string& parent, const rref_id& id, std::uint64_t token);
};

}  // namespace troupe::rref_detail
