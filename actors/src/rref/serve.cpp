// The reserved "troupe.rref.*" functions: each reads its typed message (protocol.hpp) and
// delivers it to the actor it names (Note [RRef protocol]). They run on the node's executor and
// never wait for an actor: a fetch and a fork_request are deferred replies (Note [deferred
// reply]); a remote_call is deduplicated by the router's owner entry.
#include <caf/all.hpp>

#include "context_impl.hpp"
#include "troupe/actors/rpc/api.hpp"

namespace troupe::rref_detail {

namespace {


// `quick`: the handler never blocks and takes microseconds (it hands the message on), so the
// executor's leader runs it itself (rpc::function_options::quick); only remote_call runs a user
// function.
template <class R, class Msg>
void serve(context_impl& c, const char* name, R (*handler)(context_impl&, Msg&), bool quick = true) {
  std::weak_ptr<context_impl> weak = c.shared_from_this();
  c.n_->functions().add(
      name,
      [weak, handler, name = std::string(name)](std::vector<char> bytes) -> R {
        auto self = weak.lock();
        if (!self) throw error(errc::invalid_state, name + ": the rref context of this worker is gone");
        auto m = rref_msg::from_bytes<Msg>(*self->sys_, bytes, name.c_str());
        binding_scope scope(self.get());
        return handler(*self, m);
      },
      rpc::function_options{.quick = quick});
}

// Note [withheld accept]
// The creator calls to_here right after remote(), so its thread waits in the fetch, reading its
// connection. Answered at once, the remote_call's answer would wake it once (it reads that
// answer, then sleeps again) and the fetch's answer a second time: on an idle vCPU each wake-up
// is a VM exit and IPI (~35-40 us on the build VM). So the answer is withheld: it goes right
// after the first fetch's answer on the same thread (the creator reads both with one wake-up),
// or, when no fetch comes (remote() without to_here), when the courier's timer fires, one
// rref_options::release_window after the first withheld answer (one timer for all of them; 0:
// never withheld). A fetch parked before the function finished is answered first, then the
// accept. Deleting the entry or closing the context answers it (accepted / invalid_state).
//
//   function done --lock--> parked fetches? answer them, then the accept
//                           none: entry.accept = answer; arm the courier's timer (once)
//   fetch (snapshot) --lock--> take entry.accept --> answer the fetch, then the accept
//   courier timer --lock--> take every withheld accept --> answer them
//
// Cost: the creator's fork is confirmed (and can be deleted) up to one window later when no
// to_here follows; the call's deadline is far longer.

// Runs the user function of a remote_call here, on the executor, and hands its live value to the
// router (which answers the parked fetches on this thread) and the owner actor: it is encoded only
// when a fetch is answered, so this call's response carries no tensor of it (Note [owner_rref actor]).
void run_remote(context_impl& c, rref_msg::remote_call& m, std::shared_ptr<rpc::reply_later> accept) {
  rref_msg::value_set v;
  v.fork = m.fork;
  auto fn = c.n_->functions().find(m.function);
  if (!fn) {
    v.code = static_cast<std::int32_t>(errc::unknown_function);
    v.message = "remote() of '" + m.function + "' for rref " + m.id.str() + ": worker " + c.me_ + " has no such function";
  } else {
    try {
      v.value = fn->invoke_held(m.args, [] {});
    } catch (const error& e) {
      v.code = static_cast<std::int32_t>(e.code() == errc::bad_argument ? errc::bad_argument : errc::remote_exception);
      v.message = "remote() of '" + m.function + "' on worker " + c.me_ + " (rref " + m.id.str() + ") threw: " + e.what();
    } catch (const std::exception& e) {
      v.code = static_cast<std::int32_t>(errc::remote_exception);
      v.message = "remote() of '" + m.function + "' on worker " + c.me_ + " (rref " + m.id.str() + ") threw: " + e.what();
    }
  }
  c.value_done(m.id, std::move(v), std::move(accept));
}

// A deferred reply (Note [deferred reply]): answered by value_done (Note [withheld accept]).
rpc::deferred on_remote_call(context_impl& c, rref_msg::remote_call& m) {
  auto reply = rpc::defer();
  auto start = c.start_owner(m.id);
  if (!start) reply->complete<bool>(false);         // a late duplicate of a call whose RRef is already gone
  else if (*start) run_remote(c, m, std::move(reply));  // the function runs once per id
  else reply->complete<bool>(true);                 // a duplicate only answers
  return {};
}

// The owner actor answers (Note [deferred reply]): no executor thread waits for an actor.
rpc::deferred on_fork_request(context_impl& c, rref_msg::fork_request& m) {
  auto reply = rpc::defer();
  auto owner = c.owner_for(m.id, true);
  if (!owner) reply->complete<std::int32_t>(1);  // refused: the RRef is gone (never for a live fork)
  else caf::anon_send(*owner, rref_msg::fork_request_reply{m, std::move(reply)});
  return {};
}

std::int32_t on_user_delete(context_impl& c, rref_msg::user_delete_batch& m) {
  // Created if absent: a delete that overtakes its remote_call must still be remembered. The
  // answer does not wait for the actors: the messages are in their mailboxes, and idempotent.
  for (auto& d : m.deletes)
    if (auto owner = c.owner_for(d.id, true)) caf::anon_send(*owner, std::move(d));
  return 0;
}

// Answered at once from the published snapshot when the value exists (encoded here, under this
// call's scopes), else parked in the router's entry and answered by the thread that finishes the
// function (Note [deferred reply], Note [owner_rref actor]); no thread waits, no actor hop.
rpc::deferred on_fetch(context_impl& c, rref_msg::fetch& m) {
  ++c.stats_.fetches;
  c.fetch(m.id, rpc::defer());
  return {};
}

std::int32_t on_child_ack(context_impl& c, rref_msg::child_ack& m) {
  c.deliver_ack(m);
  return 0;
}

std::int32_t on_fork_probe(context_impl& c, rref_msg::fork_probe& m) {
  const fork_key k{m.id, m.fork};
  std::lock_guard<std::mutex> lock(c.mutex_);
  if (c.users_.count(k) || c.gone_users_.contains(k) || c.owner_bound_.contains(k)) return 1;
  c.abandoned_.add(k, std::chrono::steady_clock::now(), c.opts_.tombstone_ttl);
  return 0;
}

}  // namespace

void context_impl::start() {
  serve(*this, "troupe.rref.remote_call", &on_remote_call, /*quick=*/false);  // runs the user function
  serve(*this, "troupe.rref.fork_request", &on_fork_request);
  serve(*this, "troupe.rref.child_ack", &on_child_ack);
  serve(*this, "troupe.rref.user_delete", &on_user_delete);
  serve(*this, "troupe.rref.fetch", &on_fetch);
  serve(*this, "troupe.rref.fork_probe", &on_fork_probe);
  n_->functions().add("troupe.rref.ping", [] { return std::int32_t{0}; }, rpc::function_options{.quick = true});  // Note [first contact]
  courier_ = spawn_courier(*this);
}

}  // namespace troupe::rref_detail
