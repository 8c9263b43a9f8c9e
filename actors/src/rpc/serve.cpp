// Serving one call (rpc/serve.hpp).
//
// Note [deferred reply]
// A served function may answer later. It takes the served call (rpc::served_call&) as its first
// parameter. On its executor thread it calls call.defer(), which marks the call as deferred and
// returns a reply_later handle. It returns rpc::deferred{}. serve_job then sends nothing; whoever
// holds the handle answers once, from any thread:
//
//   executor: fn(call, args) --call.defer()--> handle; return deferred{}   (no response yet)
//   any thread: handle.complete(v) --[codec context + serve scope entered]--> encode --> respond
//   last handle dropped unanswered --> respond(invalid_state "dropped its deferred reply")
//
// The encode runs under a codec context like the immediate path's (Note [codec context]). Bulk
// tensors go to a same-host caller, CUDA results keep their device. The interceptor's serve scope
// is entered again on the completing thread. The caller is its reply_to. So neither the
// caller nor the interceptor can tell a deferred result from an immediate one. If the function throws after defer(),
// the exception answers the call and the handle's later answers are ignored. The caller's
// deadline still bounds its wait.
#include "rpc/serve.hpp"

#include "rpc/byte_pool.hpp"
#include "troupe/actors/rpc/codec.hpp"

#include <atomic>
#include <optional>

#include "rpc/device_scope.hpp"
#include "rpc/intercept.hpp"

namespace troupe::detail {

namespace {

// The codec context of a served call from `caller` to `to` (Note [codec context]). Its answer's
// CUDA tensors keep their device (`answer`). Tensors go over shared memory to a same-host caller.
// RRefs in its answer know they go to `caller`.
rpc::codec_context served_context(const serve_target& to, const std::string& caller, const rpc::detail::device_scope& answer,
                                  rpc::call_scope* scope) {
  rpc::codec_context ctx;
  ctx.reply_to = &caller;
  ctx.bulk = to.bulk.get();
  ctx.shm = to.same_host;
  ctx.peer = &to.node;
  ctx.devices = &answer;
  ctx.scope = scope;
  ctx.work = to.work.get();
  return ctx;
}

// Everything a served call needs to answer, immediately or later (`req` without its payload).
struct serve_context {
  std::string function;
  rpc_request req;
  std::string me;
  serve_target to;
  std::shared_ptr<rpc::call_scope> scope;
  respond_fn respond;
};

class deferred_reply final : public rpc::reply_later {
 public:
  explicit deferred_reply(std::shared_ptr<serve_context> ctx) : ctx_(std::move(ctx)) {}
  ~deferred_reply() override {
    fail(errc::invalid_state, "function '" + ctx_->function + "' on worker " + ctx_->me + " dropped its deferred reply", nullptr);
  }

  void complete_encoded(const std::function<std::vector<char>(const rpc::codec_context&)>& encode, rpc::reply_batch* batch) override {
    if (answered_.exchange(true)) return;
    rpc_response resp{ctx_->req.id, 0, {}, {}, {}};
    try {
      const rpc::detail::device_scope answer;  // CUDA results keep their device (Note [rpc device map])
      const rpc::codec_context codec = served_context(ctx_->to, ctx_->req.caller, answer, ctx_->scope.get());
      std::optional<rpc::scope_guard> active;
      rpc::detail::guarded("enter", [&] { active.emplace(ctx_->scope.get()); });
      resp.payload = encode(codec);
      if (ctx_->scope) resp.meta = rpc::detail::guarded("take_meta", [&] { return ctx_->scope->take_meta(); });
    } catch (const std::exception& e) {
      resp = rpc_response{ctx_->req.id, static_cast<std::uint8_t>(errc::remote_exception),
                          "function '" + ctx_->function + "' on worker " + ctx_->me + " (called by " + ctx_->req.caller +
                              "): its deferred result could not be encoded: " + e.what(),
                          {}, {}};
    }
    ctx_->respond(std::move(resp), batch, {});
  }

  void with_context(const std::function<void(const rpc::codec_context&)>& fn) const override {
    const rpc::detail::device_scope answer;
    fn(served_context(ctx_->to, ctx_->req.caller, answer, ctx_->scope.get()));
  }

  void fail(errc code, const std::string& message, rpc::reply_batch* batch) override {
    if (answered_.exchange(true)) return;
    ctx_->respond(rpc_response{ctx_->req.id, static_cast<std::uint8_t>(code), message, {}, {}}, batch, {});
  }

  /// The call answered itself (the function threw after defer()): later answers do nothing.
  void settle() { answered_ = true; }

 private:
  std::shared_ptr<serve_context> ctx_;
  std::atomic<bool> answered_{false};
};

// The served call handed to its function (rpc::served_call). It holds what serve_job was given.
// Only defer() makes the context a deferred reply keeps; most calls answer at once and need no
// copy of it. It holds the handle until the function returned, so an exception that unwinds the
// function's own handle still answers the call with that exception, not with "dropped".
struct deferral_point final : rpc::served_call {
  deferral_point(const rpc::function_entry* f, const rpc_request* r, const std::string* m, const serve_target* t,
                 const std::shared_ptr<rpc::call_scope>* sc, const respond_fn* re)
      : fn(f), req(r), me(m), to(t), scope(sc), respond(re) {}

  const rpc::function_entry* fn;
  const rpc_request* req;
  const std::string* me;
  const serve_target* to;
  const std::shared_ptr<rpc::call_scope>* scope;
  const respond_fn* respond;
  std::shared_ptr<serve_context> ctx;
  std::shared_ptr<deferred_reply> handle;
  bool deferred = false;

  std::shared_ptr<rpc::reply_later> defer() override {
    if (deferred) throw error(errc::invalid_state, "served_call::defer() called twice in one served call");
    handle = std::make_shared<deferred_reply>(context());
    deferred = true;
    return handle;
  }

  const std::shared_ptr<serve_context>& context() {
    if (!ctx)
      ctx = std::make_shared<serve_context>(
          serve_context{fn->name, rpc_request{req->id, req->function, req->caller, {}, {}}, *me, *to, *scope, *respond});
    return ctx;
  }
};

rpc_response run_function(const rpc::function_entry& fn, const rpc_request& req, const std::string& me, flight_recorder* rec,
                          const rpc::codec_context& codec, rpc::served_call& call) {
  trace_scope traced(rec, trace_kind::rpc_serve, fn.name, req.id, req.caller);
  rpc_response resp;
  resp.id = req.id;
  bool started = false;
  auto fail = [&](errc decode_code, const std::string& text) {
    resp.code = static_cast<std::uint8_t>(started ? errc::remote_exception : decode_code);
    resp.message = started ? "function '" + fn.name + "' on worker " + me + " (called by " + req.caller + ") threw: " + text
                           : text + " (on worker " + me + ")";
  };
  try {
    resp.payload = fn.invoke(codec, req.payload, [&] { started = true; }, &call);
  } catch (const rpc::detail::interceptor_failure& e) {
    resp.code = static_cast<std::uint8_t>(errc::remote_exception);
    resp.message = "worker " + me + " serving '" + fn.name + "' (called by " + req.caller + "): " + e.message();
  } catch (const rpc::reply_error& e) {  // the function chose its answer's code
    resp.code = static_cast<std::uint8_t>(e.code());
    resp.message = e.message();
  } catch (const troupe::error& e) {
    fail(e.code(), started ? std::string(to_string(e.code())) + ": " + e.message() : e.message());
  } catch (const std::exception& e) {
    fail(errc::bad_argument, e.what());
  } catch (...) {
    fail(errc::bad_argument, "unknown exception");
  }
  if (resp.code != 0) traced.fail();
  return resp;
}

// Runs the function with `point` as its served call; answers unless the function deferred
// (Note [deferred reply]). The result is copied into its payload: no path borrows yet (Note
// [borrowed tensor bytes]), so `borrowed` stays empty.
void run_and_answer(deferral_point& point, const rpc::codec_context& codec, rpc_response take_meta_into(rpc_response, rpc::call_scope*)) {
  rpc::detail::borrowed_parts borrowed;
  rpc::codec_context gathering = codec;
  rpc_response resp = run_function(*point.fn, *point.req, *point.me, point.to->recorder, gathering, point);
  if (resp.code != 0) borrowed.clear();  // the encode failed part way: the payload is empty
  if (point.deferred) {
    if (resp.code == 0) return;  // the handle answers (or, dropped, answers "dropped" as the caller's `point` goes)
    point.handle->settle();      // the function threw after defer(): the exception answers
  }
  (*point.respond)(take_meta_into(std::move(resp), point.scope->get()), nullptr, std::move(borrowed));
}

rpc_response with_meta(rpc_response resp, rpc::call_scope* scope) {
  if (scope) resp.meta = rpc::detail::guarded("take_meta", [&] { return scope->take_meta(); });
  return resp;
}

// serve_job; inline tensors of the request may view its payload when `keep` is set.
void serve_keeping(const rpc::function_entry& fn, const rpc_request& req, const std::string& me, const serve_target& to,
                   rpc::call_interceptor* ic, const rpc::detail::payload_keeper* keep, respond_fn respond) {
  const rpc::detail::device_scope answer;  // CUDA results keep their device (Note [rpc device map])
  std::shared_ptr<rpc::call_scope> scope;
  deferral_point point(&fn, &req, &me, &to, &scope, &respond);
  rpc::codec_context codec = served_context(to, req.caller, answer, nullptr);  // the result may go through shared memory
  codec.keeper = keep;
  if (!ic) {
    run_and_answer(point, codec, [](rpc_response r, rpc::call_scope*) { return r; });
    return;
  }
  try {
    scope = rpc::detail::guarded("begin_serve", [&] { return ic->begin_serve(req.caller, req.function, req.meta); });
    codec.scope = scope.get();
    std::optional<rpc::scope_guard> active;
    rpc::detail::guarded("enter", [&] { active.emplace(scope.get()); });
    run_and_answer(point, codec, &with_meta);
  } catch (const rpc::detail::interceptor_failure& e) {
    respond(rpc_response{req.id, static_cast<std::uint8_t>(errc::remote_exception),
                              "worker " + me + " serving '" + fn.name + "' (called by " + req.caller + "): " + e.message(), {}, {}},
            nullptr, {});
  }
}

}  // namespace

void serve_job(const rpc::function_entry& fn, const rpc_request& req, const std::string& me, const serve_target& to,
               rpc::call_interceptor* ic, respond_fn respond) {
  serve_keeping(fn, req, me, to, ic, nullptr, std::move(respond));
}

void serve_adopting(const rpc::function_entry& fn, rpc_request& req, bool adopt, const std::string& me, const serve_target& to,
                    rpc::call_interceptor* ic, respond_fn respond) {
  std::shared_ptr<std::vector<char>> holder;
  {
    std::optional<rpc::detail::payload_keeper> keep;
    if (adopt && req.payload.size() >= rpc::detail::adopt_min_bytes) {
      holder = std::shared_ptr<std::vector<char>>(new std::vector<char>(), [bulk = std::weak_ptr<bulk_names>(to.bulk)](std::vector<char>* v) {
        if (v->capacity() >= byte_pool_min_bytes)
          if (auto b = bulk.lock()) b->buffers().give(std::move(*v));
        delete v;
      });
      keep.emplace(req.payload, holder);
    }
    serve_keeping(fn, req, me, to, ic, keep ? &*keep : nullptr, std::move(respond));
  }
  if (holder && holder.use_count() > 1) *holder = std::move(req.payload);
}

}  // namespace troupe::detail
