#pragma once
// Serving one call of the direct channel on an executor thread (Note [direct channel]).

#include <functional>
#include <memory>
#include <string>

#include <caf/node_id.hpp>

#include "rpc/borrowed_parts.hpp"
#include "rpc/bulk.hpp"
#include "troupe/actors/flight_recorder.hpp"
#include "troupe/actors/messages.hpp"
#include "troupe/actors/rpc/interceptor.hpp"
#include "troupe/actors/rpc/registry.hpp"

namespace troupe::detail {

/// Where the result of a served call goes, for Note [tensor over shared memory].
struct serve_target {
  bool same_host = false;
  std::shared_ptr<bulk_names> bulk;  ///< shared: a deferred reply may encode after the call returned
  caf::node_id node;
  flight_recorder* recorder = nullptr;  ///< the node's (Note [flight recorder]); records the serve
  /// The node's executor, told before a large tensor of the answer is copied (Note [predicted
  /// quick]); shared: a deferred reply may encode after the node is gone.
  std::shared_ptr<const rpc::long_work_notice> work;
};

/// Takes a served call's response and the reply batch it was given into (null: send it now;
/// Note [reply batch]). Also takes the tensor bytes that belong in its payload
/// (Note [borrowed tensor bytes]).
using respond_fn = std::function<void(rpc_response, rpc::reply_batch*, rpc::detail::borrowed_parts)>;

/// Decodes, runs and encodes one call. The codec context is for `to`, with the caller as reply_to
/// and the interceptor's serve scope (Note [codec context]). Hands the response to `respond`:
/// at once, or later from the thread that completes a deferred reply (Note [deferred reply]). Never throws: every failure becomes the response's code
/// (bad_argument, remote_exception, ...).
void serve_job(const rpc::function_entry& fn, const rpc_request& req, const std::string& me, const serve_target& to,
               rpc::call_interceptor* ic, respond_fn respond);

/// serve_job for a request served once (no fault plan's copies of it). Its large inline tensors
/// may view its payload (Note [adopted payload]). If one does, the payload (the same heap block)
/// moves out of `req` into a holder those tensors keep alive. The holder gives it back to `to`'s
/// byte pool when the last of them goes, if the node still exists. Nothing else of the request stays
/// with them. `adopt` false: serve_job as is.
void serve_adopting(const rpc::function_entry& fn, rpc_request& req, bool adopt, const std::string& me, const serve_target& to,
                    rpc::call_interceptor* ic, respond_fn respond);

}  // namespace troupe::detail
