// The callee side of the direct channel (rpc/call_server.hpp).
#include "rpc/call_server.hpp"

#include "rpc/byte_pool.hpp"
#include "rpc/run_prediction.hpp"
#include "rpc/serve.hpp"
#include "rpc/split_frame.hpp"

namespace troupe::detail {

call_server::call_server(direct_channel_config cfg, frame_sender& sender, frame_sender::later_fn later)
    : cfg_(std::move(cfg)), sender_(sender), later_(std::move(later)) {}

void call_server::on_request(const std::shared_ptr<channel_conn>& c, rpc_request req, led_jobs* jobs) {
  req.caller = c->peer;  // the ticket names the caller, not the request
  transport_decision d;
  if (cfg_.hook) {
    envelope env{message_kind::rpc_request, req.caller, cfg_.me.name, req.id, req.function, std::move(req.payload), std::move(req.meta)};
    d = cfg_.hook->on_receive(env);
    req.payload = std::move(env.payload);
    req.meta = std::move(env.meta);
  }
  if (d.copies <= 0) return;
  if (d.delay.count() > 0) {
    later_(d.delay, [this, owner = owner_.lock(), c, req = std::move(req), copies = d.copies]() mutable {
      serve(c, std::move(req), copies, nullptr);
    });
    return;
  }
  serve(c, std::move(req), d.copies, jobs);
}

void call_server::serve(const std::shared_ptr<channel_conn>& c, rpc_request req_in, int copies, led_jobs* jobs) {
  // The jobs (more than one only for a duplicating fault plan) share the request. Copying it
  // would copy its payload, a whole extra pass over a large tensor sent as bytes. When they are
  // done, a large payload's buffer goes back to the node's pool (Note [byte pool]).
  // Everything the job needs, in one allocation.
  struct served_request {
    rpc_request req;
    std::shared_ptr<const rpc::function_entry> fn;
    serve_target to;
    std::shared_ptr<rpc::call_interceptor> ic;
    served_request(rpc_request r, std::shared_ptr<const rpc::function_entry> f, serve_target t, std::shared_ptr<rpc::call_interceptor> i)
        : req(std::move(r)), fn(std::move(f)), to(std::move(t)), ic(std::move(i)) {}
    served_request(const served_request&) = delete;
    served_request& operator=(const served_request&) = delete;
    ~served_request() {
      if (req.payload.capacity() >= byte_pool_min_bytes && to.bulk) to.bulk->buffers().give(std::move(req.payload));
    }
  };
  auto fn = cfg_.functions->find(req_in.function);
  if (!fn) {
    respond(c, rpc_response{req_in.id, static_cast<std::uint8_t>(errc::unknown_function),
                            "worker " + cfg_.me.name + " has no function '" + req_in.function + "'", {}, {}});
    return;
  }
  const bool quick = fn->quick || (jobs && predicted_short(*fn->history, *jobs));  // Note [predicted quick]
  // Built in place (its destructor leaves it without a move constructor: a temporary would be
  // copied, payload and all).
  auto held = std::make_shared<served_request>(std::move(req_in), std::move(fn),
                                               serve_target{same_host(c->peer_node, cfg_.my_node), cfg_.bulk, c->peer_node, cfg_.recorder, cfg_.exec},
                                               cfg_.interceptor ? cfg_.interceptor->get() : nullptr);
  for (int i = 0; i < copies; ++i) {
    auto job = [this, owner = owner_.lock(), c, held, adopt = copies == 1] {
      const auto began = clock::now();
      const auto& fn = *held->fn;
      // Note [adopted payload]: large inline tensors view the request's payload.
      serve_adopting(fn, held->req, adopt, cfg_.me.name, held->to, held->ic.get(),
                     [this, owner, c](rpc_response r, rpc::reply_batch* batch, rpc::detail::borrowed_parts b) {
                       respond(c, std::move(r), batch, std::move(b));
                     });
      record_run(*fn.history, clock::now() - began);
    };
    if (jobs) (quick ? jobs->quick : jobs->jobs).push_back(std::move(job));
    else if (!cfg_.exec->post(std::move(job)))
      respond(c, rpc_response{held->req.id, static_cast<std::uint8_t>(errc::invalid_state), "worker " + cfg_.me.name + " is shutting down", {}, {}});
  }
}

void call_server::respond(const std::shared_ptr<channel_conn>& c, rpc_response resp, rpc::reply_batch* batch,
                          rpc::detail::borrowed_parts borrowed) {
  transport_decision d;
  if (cfg_.hook) {
    borrowed.flatten_into(resp.payload);  // the hook sees, keeps and copies whole payloads
    envelope env{message_kind::rpc_response, cfg_.me.name, c->peer, resp.id, {}, std::move(resp.payload), std::move(resp.meta)};
    d = cfg_.hook->on_send(env);
    resp.payload = std::move(env.payload);
    resp.meta = std::move(env.meta);
  }
  const std::size_t bytes = resp.payload.size() + borrowed.bytes();
  if (bytes >= split_payload_bytes) {  // a large payload is not copied into the frame
    const auto id = resp.id;
    if (sender_.send_large(c, frame_kind::response, std::move(resp), d, batch, std::move(borrowed))) return;
    resp = rpc_response{id, static_cast<std::uint8_t>(errc::remote_exception),
                        "worker " + cfg_.me.name + ": the result (" + std::to_string(bytes) + " bytes encoded) is more than one message carries (" +
                            std::to_string(channel_max_body(cfg_)) + " bytes)",
                        {}, {}};
  }
  sender_.send(c, frame_kind::response, resp, d, batch);  // cannot fail: bytes and strings only
}

}  // namespace troupe::detail
