// The data path's reserved RPC functions "troupe.rref.remote_call" and "troupe.rref.fetch".
// Each reads its typed message (protocol.hpp). They run on the node's executor and never wait
// for an actor: both are deferred replies (Note [deferred reply]). The router's owner entry
// deduplicates a remote_call. The control messages go to the service actor (service.cpp).
//
// Note [rref data path]
//
// remote() and to_here() are RPC calls. remote() runs a user function: it is a remote call, on
// the owner's executor, with the call's deadline and cancellation. A fetch's answer is the
// value encoded by the RPC codec under the fetch's served-call scopes. So tensors travel as
// RPC's do (shared memory between processes of one host), and distributed autograd records its
// send there. The withheld accept rides in the same write as the value
// (Note [withheld accept]), so the creator reads both with one wake-up. As actor messages they
// would take an actor hop on each side of the call and lose that batching.
#include <caf/all.hpp>

#include "context_impl.hpp"
#include "troupe/actors/remote_actor.hpp"
#include "troupe/actors/rpc/api.hpp"

namespace troupe::rref_detail {

namespace {


// `quick`: the handler never blocks and takes microseconds (it hands the message on). So the
// executor's leader runs it itself (rpc::function_options::quick). Only remote_call runs a user
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
        return handler(*self, m);
      },
      rpc::function_options{.quick = quick});
}

// The same for a handler that answers later (Note [deferred reply]).
template <class Msg>
void serve(context_impl& c, const char* name, rpc::deferred (*handler)(context_impl&, rpc::served_call&, Msg&), bool quick = true) {
  std::weak_ptr<context_impl> weak = c.shared_from_this();
  c.n_->functions().add(
      name,
      [weak, handler, name = std::string(name)](rpc::served_call& call, std::vector<char> bytes) -> rpc::deferred {
        auto self = weak.lock();
        if (!self) throw error(errc::invalid_state, name + ": the rref context of this worker is gone");
        auto m = rref_msg::from_bytes<Msg>(*self->sys_, bytes, name.c_str());
        return handler(*self, call, m);
      },
      rpc::function_options{.quick = quick});
}

// Note [withheld accept]
// The creator calls to_here right after remote(), so its thread waits in the fetch, reading its
// connection. Answered at once, the remote_call's answer would wake it once (it reads that
// answer, then sleeps again) and the fetch's answer a second time. On an idle vCPU each wake-up
// is a VM exit and an IPI (docs/benchmarks.md). So the answer is withheld. It goes right after
// the first fetch's answer on the same thread, and the creator reads both with one wake-up.
// When no fetch comes (remote() without to_here), it goes when the courier's timer fires. That
// is one rref_options::release_window after the first withheld answer, with one timer for all
// of them (0: never withheld). A fetch parked before the function finished is answered first,
// then the accept. Deleting the entry or closing the context answers it (accepted /
// invalid_state).
//
//   function done --lock--> parked fetches? answer them, then the accept
//                           none: entry.accept = answer; arm the courier's timer (once)
//   fetch (snapshot) --lock--> take entry.accept --> answer the fetch, then the accept
//   courier timer --lock--> take every withheld accept --> answer them
//
// Cost: the creator's fork is confirmed (and can be deleted) up to one window later when no
// to_here follows; the call's deadline is far longer.

// Runs the user function of a remote_call here, on the executor. It hands the live value to the
// router, which answers the parked fetches on this thread, and to the owner actor. The value is
// encoded only when a fetch is answered. So this call's response carries no tensor of it
// (Note [owner_rref actor]).
void run_remote(context_impl& c, rref_msg::remote_call& m, std::shared_ptr<rpc::reply_later> accept) {
  rref_msg::value_set v;
  v.fork = m.fork;
  auto fn = c.n_->functions().find(m.function);
  if (!fn) {
    v.code = static_cast<std::int32_t>(errc::unknown_function);
    v.message = "remote() of '" + m.function + "' for rref " + m.id.str() + ": worker " + c.me_ + " has no such function";
  } else {
    try {
      // The args travel nested in the call's: decoded under the served call's codec context, their
      // RRefs bound to this context.
      binding_scope bind_here(&c);
      accept->with_context([&](const rpc::codec_context& ctx) {
        rpc::codec_context args = ctx;
        args.handles = &bind_here;
        v.value = fn->invoke_held(args, m.args, [] {});
      });
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
rpc::deferred on_remote_call(context_impl& c, rpc::served_call& call, rref_msg::remote_call& m) {
  auto reply = call.defer();
  auto start = c.start_owner(m.id);
  if (!start) reply->complete<bool>(false);         // a late duplicate of a call whose RRef is already gone
  else if (*start) run_remote(c, m, std::move(reply));  // the function runs once per id
  else reply->complete<bool>(true);                 // a duplicate only answers
  return {};
}

// The owner actor answers (Note [deferred reply]): no executor thread waits for an actor.
// When the value exists, the fetch is answered at once from the published snapshot (encoded
// here, under this call's scopes). Else it is parked in the router's entry and answered by the
// thread that finishes the function (Note [deferred reply], Note [owner_rref actor]). No thread
// waits, and there is no actor hop.
rpc::deferred on_fetch(context_impl& c, rpc::served_call& call, rref_msg::fetch& m) {
  ++c.stats_.fetches;
  c.fetch(m.id, call.defer());
  return {};
}

}  // namespace

void serve_data_path(context_impl& c) {
  serve(c, "troupe.rref.remote_call", &on_remote_call, /*quick=*/false);  // runs the user function
  serve(c, "troupe.rref.fetch", &on_fetch);
}

}  // namespace troupe::rref_detail
