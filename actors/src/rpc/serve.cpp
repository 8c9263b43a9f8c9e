// Serving one call (rpc/serve.hpp).
#include "rpc/serve.hpp"

#include <optional>

#include "rpc/intercept.hpp"
#include "troupe/actors/rref/caller.hpp"

namespace troupe::detail {

namespace {

rpc_response run_function(const rpc::function_entry& fn, const rpc_request& req, const std::string& me) {
  rpc_response resp;
  resp.id = req.id;
  bool started = false;
  auto fail = [&](errc decode_code, const std::string& text) {
    resp.code = static_cast<std::uint8_t>(started ? errc::remote_exception : decode_code);
    resp.message = started ? "function '" + fn.name + "' on worker " + me + " (called by " + req.caller + ") threw: " + text
                           : text + " (on worker " + me + ")";
  };
  try {
    resp.payload = fn.invoke(req.payload, [&] { started = true; });
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
  return resp;
}

// Runs one served call under the interceptor's serve scope (Note [call interceptor]): decode,
// run and encode with the scope active, then its meta goes with the response. An exception from
// the interceptor answers the call with remote_exception.
rpc_response serve_call(const rpc::function_entry& fn, const rpc_request& req, const std::string& me, rpc::call_interceptor* ic) {
  if (!ic) return run_function(fn, req, me);
  try {
    auto scope = rpc::detail::guarded("begin_serve", [&] { return ic->begin_serve(req.caller, req.function, req.meta); });
    std::optional<rpc::scope_guard> active;
    rpc::detail::guarded("enter", [&] { active.emplace(scope.get()); });
    rpc_response resp = run_function(fn, req, me);
    if (scope) resp.meta = rpc::detail::guarded("take_meta", [&] { return scope->take_meta(); });
    return resp;
  } catch (const rpc::detail::interceptor_failure& e) {
    return rpc_response{req.id, static_cast<std::uint8_t>(errc::remote_exception),
                        "worker " + me + " serving '" + fn.name + "' (called by " + req.caller + "): " + e.message(), {}, {}};
  }
}

}  // namespace

rpc_response serve_job(const rpc::function_entry& fn, const rpc_request& req, const std::string& me, const serve_target& to,
                       rpc::call_interceptor* ic) {
  bulk_scope scope(to.same_host, to.bulk, to.node);  // the result may go through shared memory
  rref_detail::caller_scope caller(req.caller);       // RRefs in the result know where they go
  return serve_call(fn, req, me, ic);
}

}  // namespace troupe::detail
