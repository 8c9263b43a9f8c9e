// The data path of an rref handle: remote()'s start, the fetch behind to_here(), and the local
// value (Note [RRef protocol] in rref/context.hpp). Data goes through node::call (remote_call,
// fetch). Waiting happens in the actors (parked fetches as deferred replies), never on an
// executor thread of the owner.
#include <atomic>
#include <future>

#include <caf/all.hpp>

#include "context_impl.hpp"
#include "troupe/actors/rpc/api.hpp"

namespace troupe::rref_detail {

namespace {

using clock = std::chrono::steady_clock;

[[noreturn]] void rethrow_for_owner(const error& e, const handle& h, const char* op) {
  if (e.code() != errc::peer_lost) throw e;
  h.ctx->mark_lost(h.owner);
  throw error(errc::owner_lost, std::string(op) + " of rref " + h.id.str() + ": owner " + h.owner + " is lost (" + e.message() + ")");
}

[[noreturn]] void no_value(const handle& h, const std::string& where, std::chrono::milliseconds timeout) {
  throw error(errc::timeout, "to_here of rref " + h.id.str() + ": no value on owner " + where + " within " + std::to_string(timeout.count()) + " ms");
}

void check_usable(const handle& h, const char* op) {
  if (!h.bound || !h.ctx)
    throw error(errc::invalid_state, std::string(op) + " of rref " + h.id.str() +
                                         ": the rref was received outside an rref_context (use rref_context::add / rpc_sync)");
  if (h.failed != errc::ok) throw error(h.failed, h.failure);
}

}  // namespace

void check_owner(const handle& h, const char* op) {
  if (h.ctx && h.ctx->is_lost(h.owner))
    throw error(errc::owner_lost, std::string(op) + " of rref " + h.id.str() + ": owner " + h.owner + " is lost");
}

void note_owner_lost(const handle& h) {
  if (h.ctx) h.ctx->mark_lost(h.owner);
}

std::shared_ptr<rpc::detail::call_state> fetch_call(const handle& h, std::chrono::milliseconds timeout) {
  check_usable(h, "to_here");
  check_owner(h, "to_here");
  auto& c = *h.ctx;
  // One call, also on the creator before its remote_call is answered. The owner answers it when
  // the value exists (a deferred reply, Note [deferred reply]). So remote + to_here costs one
  // round trip beyond the function. A dead owner fails it with peer_lost within the runtime's
  // bound.
  std::shared_ptr<rpc::detail::call_state> st;
  try {
    st = c.n_->call(h.owner, "troupe.rref.fetch", [&](const rpc::codec_context& ctx) {
      return rpc::encode_args<std::vector<char>>(ctx, rref_msg::to_bytes(*c.sys_, rref_msg::fetch{h.id, h.fork, c.me_}));
    }, timeout);
    // Blocks until answered, bounded by the call's deadline. The withheld remote_call answer came
    // with the value (read already). Its continuation, the creator fork's remote_done, waits for
    // the handle's next use or its release (handle::watch). Sent with the release, it schedules
    // the fork's actor once for both, and to_here returns without waking a scheduler thread.
    (void)st->value();
  } catch (const error& e) {
    watch_remote(h);
    if (e.code() == errc::timeout) no_value(h, h.owner, timeout);
    rethrow_for_owner(e, h, "to_here");
  }
  return st;
}

rref_msg::held_ptr held_here(const handle& h, std::chrono::milliseconds timeout, bool wait) {
  check_usable(h, wait ? "to_here" : "local_value");
  auto& c = *h.ctx;
  if (!wait && h.owner != c.me_)
    throw error(errc::invalid_state, "local_value() of rref " + h.id.str() + " on worker " + c.me_ +
                                         ": only its owner " + h.owner + " holds the value; use to_here()");
  auto a = c.owner_for(h.id, false);
  if (!a) throw error(errc::invalid_state, "rref " + h.id.str() + " was deleted by its owner " + c.me_);
  const auto deadline = std::chrono::duration_cast<std::chrono::milliseconds>((clock::now() + timeout).time_since_epoch()).count();
  auto r = c.ask<rref_msg::held_answer>(*a, wait ? timeout : answers_at_once, rref_msg::local_fetch{wait ? deadline : 0});
  if (!r) {
    if (wait) no_value(h, c.me_, timeout);
    throw error(errc::invalid_state, "local_value() of rref " + h.id.str() + ": the owner actor on " + c.me_ + " did not answer");
  }
  if (r->code != 0) throw error(static_cast<errc>(r->code), r->message);
  return std::move(r->value);
}

std::shared_ptr<handle> start_remote(context_impl& c, const std::string& to, const std::string& function,
                                     const std::function<std::vector<char>(const rpc::codec_context&)>& encode, std::chrono::milliseconds timeout) {
  auto h = std::make_shared<handle>();
  h->ctx = c.shared_from_this();
  h->owner = to;
  h->bound = true;
  const auto n = c.next_id();
  h->id = rref_id{c.me_, n};
  h->fork = fork_id{c.me_, n};  // the creator fork (Note [RRef protocol])
  user_rref_actor u;
  {
    std::lock_guard<std::mutex> lock(c.mutex_);
    if (c.closed_) throw error(errc::invalid_state, "remote() on " + c.me_ + ": the rref context is closed");
    u = spawn_user_rref(c, h->id, h->fork, user_origin{to, true, {}, {}, 0});
    c.users_.emplace(fork_key{h->id, h->fork}, u);
  }
  ++c.stats_.remote_calls;
  c.in_flight_add(1);
  std::weak_ptr<context_impl> weak = h->ctx;
  auto done = [weak, u, to](errc code, bool accepted, std::vector<send_scope::sent> carried, bool release) {
    if (auto self = weak.lock()) {
      if (code != errc::ok && !carried.empty()) probe(*self, to, std::move(carried));
      if (code == errc::peer_lost) self->mark_lost(to);  // before to_here wakes: it then fails at once
      rref_msg::remote_done d{static_cast<std::int32_t>(code), accepted, release};
      if (release) self->hand_release(u, d);  // the handle's release: through the courier
      else caf::anon_send(u, d);
      self->in_flight_add(-1);
    }
  };
  send_scope scope;  // rrefs among the args: probed if the call fails
  std::shared_ptr<rpc::detail::call_state> st;
  try {
    // The args are encoded inside node::call, so the call's interceptor scope sees their tensors.
    st = c.n_->call(to, "troupe.rref.remote_call", [&](const rpc::codec_context& ctx) {
      rpc::codec_context args = ctx;
      args.handles = &scope;
      return rpc::encode_args<std::vector<char>>(ctx, rref_msg::to_bytes(*c.sys_, rref_msg::remote_call{h->id, h->fork, function, encode(args)}));
    }, timeout);
  } catch (const error& e) {
    const bool peer = e.code() == errc::peer_lost || e.code() == errc::timeout;
    done(peer ? e.code() : errc::invalid_state, false, scope.take(), false);
    if (!peer) throw;  // the arguments could not be encoded: nothing was sent
    return h;
  }
  // Run on the thread that completes the call (no executor hop): it only sends messages.
  auto carried = scope.take();
  const bool probe_on_failure = !carried.empty();
  // `release` (the handle is being released): whichever of the continuation and this function
  // takes `turn` first decides whether the release rides on remote_done. Either way both agree.
  auto watch = [st, done, carried = std::move(carried)](bool release) mutable {
    auto turn = std::make_shared<std::atomic<int>>(release ? 1 : 0);  // 1: releasing, 2: ran, 3: too late
    rpc::future<bool>(st).then_inline([done, carried = std::move(carried), turn](const rpc::future<bool>& r) mutable {
      const bool with_release = turn->exchange(2) == 1;
      try {
        const bool accepted = r.get();
        done(errc::ok, accepted, {}, with_release);
      } catch (const error& e) {
        done(e.code(), false, std::move(carried), with_release);
      }
    });
    return turn->exchange(3) == 2 && release;
  };
  if (probe_on_failure) watch(false);  // carried rrefs: their holds must not wait for this handle's use
  else h->watch = std::move(watch);
  return h;
}

}  // namespace troupe::rref_detail
