// The direct RPC channel: calls, serving, responses and the pending table
// (Note [direct channel] in rpc/direct_channel.hpp).
#include "rpc/direct_channel.hpp"

#include "troupe/actors/rpc/reply_batch.hpp"
#include "rpc/byte_pool.hpp"
#include "rpc/run_prediction.hpp"
#include "rpc/serve.hpp"
#include "rpc/split_frame.hpp"
#include "rpc/wire.hpp"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <tuple>

namespace troupe::detail {

namespace {

// Note [reply batch]: the frames held by the reply_batch scopes of this thread (outermost flushes).
struct held_replies {
  int depth = 0;
  std::vector<std::pair<std::shared_ptr<channel_conn>, std::vector<char>>> per_conn;  // in first-use order
};
thread_local held_replies tls_replies;

// This thread's buffer for the small frame it is about to send (direct_channel::send_frame), emptied.
std::vector<char>& scratch_frame() {
  thread_local std::vector<char> frame;
  frame.clear();
  return frame;
}

}  // namespace

}  // namespace troupe::detail

namespace troupe::rpc {

reply_batch::reply_batch() { ++troupe::detail::tls_replies.depth; }

reply_batch::~reply_batch() {
  auto& h = troupe::detail::tls_replies;
  if (--h.depth > 0) return;
  auto held = std::exchange(h.per_conn, {});
  for (auto& [c, bytes] : held) c->write(bytes.data(), bytes.size());  // closed: the I/O thread fails the calls
}

}  // namespace troupe::rpc

namespace troupe::detail {

void direct_channel::send_copies(const std::shared_ptr<channel_conn>& c, std::vector<char> frame, const transport_decision& d) {
  if (d.copies <= 0) return;
  if (tls_replies.depth > 0 && d.delay.count() <= 0 && !c->outgoing()) {  // a response, held (Note [reply batch])
    auto& per = tls_replies.per_conn;
    auto it = std::find_if(per.begin(), per.end(), [&](const auto& p) { return p.first == c; });
    if (it == per.end()) it = per.insert(per.end(), {c, {}});
    for (int i = 0; i < d.copies; ++i) it->second.insert(it->second.end(), frame.begin(), frame.end());
    return;
  }
  auto send = [c, frame = std::move(frame), copies = d.copies] {
    for (int i = 0; i < copies; ++i)
      if (!c->write(frame.data(), frame.size())) return;  // closed: the I/O thread fails the calls
  };
  if (d.delay.count() > 0) later(d.delay, std::move(send));
  else send();
}

// One small frame, built in this thread's scratch buffer: written from it at once in the usual
// case (no allocation per call), copied only when it must be kept (held replies, a delay, copies).
void direct_channel::send_frame(const std::shared_ptr<channel_conn>& c, const std::vector<char>& frame, const transport_decision& d) {
  if (d.copies == 1 && d.delay.count() <= 0 && !(tls_replies.depth > 0 && !c->outgoing())) {
    c->write(frame.data(), frame.size());  // closed: the I/O thread fails the calls
    return;
  }
  send_copies(c, frame, d);
}

void direct_channel::send_split(const std::shared_ptr<channel_conn>& c, const split_frame& f, const transport_decision& d) {
  if (d.copies <= 0) return;
  if ((tls_replies.depth > 0 && !c->outgoing()) || d.delay.count() > 0) return send_copies(c, f.flat(), d);  // kept: one buffer
  const channel_conn::part parts[3] = {{f.head.data(), f.head.size()}, {f.payload->data(), f.payload->size()}, {f.tail.data(), f.tail.size()}};
  const bool fragmented = f.size() - frame_header_size >= fragment_min_bytes;  // Note [fragments]
  for (int i = 0; i < d.copies; ++i)
    if (!(fragmented ? c->write_fragmented(parts, 3) : c->write_parts(parts, 3))) return;  // closed: the I/O thread fails the calls
}

template <class T>
bool direct_channel::send_large(const std::shared_ptr<channel_conn>& c, frame_kind kind, T msg, const transport_decision& d) {
  struct large {
    T msg;
    split_frame f;
  };
  auto l = std::make_shared<large>();
  l->msg = std::move(msg);
  if (!make_split_frame(l->f, kind, l->msg, max_body())) return false;  // l->f points into l->msg, which stays put
  const bool background = l->f.size() - frame_header_size >= fragment_min_bytes && d.copies > 0 && d.delay.count() <= 0 &&
                          !(tls_replies.depth > 0 && !c->outgoing());  // held replies keep one buffer
  // Weak: the writer thread must never hold the last reference (stop() joins it).
  auto send = [weak = weak_from_this(), c, l, d] {
    auto self = weak.lock();
    if (!self) return;
    self->send_split(c, l->f, d);
    if (self->cfg_.bulk) self->cfg_.bulk->buffers().give(std::move(l->msg.payload));  // written or copied: Note [byte pool]
  };
  if (background) writer_.post(std::move(send));
  else send();
  return true;
}

void direct_channel::call(const std::shared_ptr<channel_conn>& c, const std::shared_ptr<rpc::detail::call_state>& st,
                     const std::string& function, std::vector<char> payload, std::vector<char> meta) {
  std::uint64_t id = 0;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    if (stopping_) {
      st->complete(errc::invalid_state, st->what() + ": node " + cfg_.me.name + " shut down", {});
      return;
    }
    id = next_id_++;
    const auto dl = deadlines_.emplace(st->deadline(), id);
    install_helper(c, *st, id);  // a waiter reads the response itself; a continuation or poll unattends it
    pending_.emplace(id, pending_call{st, c.get(), function, dl, false});
    ++c->pending_calls;
  }
  if (c->closed()) {  // lost before we could send: fail now rather than at the deadline
    finish(c.get(), id, errc::peer_lost, "worker " + c->peer + " was lost (connection closed) before call to '" + function + "' from " + cfg_.me.name, {}, {});
    return;
  }
  rpc_request req{id, function, cfg_.me.name, std::move(payload), std::move(meta)};
  transport_decision d;
  if (cfg_.hook) {
    envelope env{message_kind::rpc_request, cfg_.me.name, c->peer, id, function, std::move(req.payload), std::move(req.meta)};
    d = cfg_.hook->on_send(env);
    req.payload = std::move(env.payload);
    req.meta = std::move(env.meta);
  }
  if (req.payload.size() >= split_payload_bytes) {  // a large payload is not copied into the frame
    wake_if_first_deadline(st->deadline());
    const std::size_t bytes = req.payload.size();
    if (send_large(c, frame_kind::request, std::move(req), d)) return;
    finish(c.get(), id, errc::bad_argument,
           st->what() + ": its arguments (" + std::to_string(bytes) + " bytes encoded) are more than one message carries (" +
               std::to_string(max_body()) + " bytes)",
           {}, {});
    return;
  }
  auto& frame = scratch_frame();
  if (!append_frame(frame, frame_kind::request, req)) {
    finish(c.get(), id, errc::bad_argument, st->what() + ": cannot serialize the request", {}, {});
    return;
  }
  wake_if_first_deadline(st->deadline());
  send_frame(c, frame, d);
}

void direct_channel::wake_if_first_deadline(clock::time_point deadline) {
  // The I/O thread sleeps until the earliest deadline it knew of; an earlier one needs a wake.
  if (deadline < clock::now() + std::chrono::milliseconds(max_poll_ms)) wake();
}

void direct_channel::on_request(const std::shared_ptr<channel_conn>& c, rpc_request req, job_list* jobs) {
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
    later(d.delay, [self = shared_from_this(), c, req = std::move(req), copies = d.copies]() mutable {
      self->serve(c, std::move(req), copies, nullptr);
    });
    return;
  }
  serve(c, std::move(req), d.copies, jobs);
}

void direct_channel::serve(const std::shared_ptr<channel_conn>& c, rpc_request req_in, int copies, job_list* jobs) {
  // The jobs (more than one only for a duplicating fault plan) share the request: copying it
  // copied its payload, a whole extra pass over a large tensor sent as bytes. When they are done,
  // a large payload's buffer goes back to the node's pool (Note [byte pool]).
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
                                               serve_target{same_host(c->peer_node, cfg_.my_node), cfg_.bulk, c->peer_node, cfg_.recorder},
                                               cfg_.interceptor ? cfg_.interceptor->get() : nullptr);
  for (int i = 0; i < copies; ++i) {
    auto job = [self = shared_from_this(), c, held, adopt = copies == 1] {
      const auto began = clock::now();
      const auto& fn = *held->fn;
      // Note [adopted payload]: large inline tensors view the request's payload.
      serve_adopting(fn, held->req, adopt, self->cfg_.me.name, held->to, held->ic.get(),
                     [self, c](rpc_response r) { self->respond(c, std::move(r)); });
      record_run(*fn.history, clock::now() - began);
    };
    if (jobs) (quick ? jobs->quick : jobs->jobs).push_back(std::move(job));
    else if (!cfg_.exec->post(std::move(job)))
      respond(c, rpc_response{held->req.id, static_cast<std::uint8_t>(errc::invalid_state), "worker " + cfg_.me.name + " is shutting down", {}, {}});
  }
}

void direct_channel::respond(const std::shared_ptr<channel_conn>& c, rpc_response resp) {
  transport_decision d;
  if (cfg_.hook) {
    envelope env{message_kind::rpc_response, cfg_.me.name, c->peer, resp.id, {}, std::move(resp.payload), std::move(resp.meta)};
    d = cfg_.hook->on_send(env);
    resp.payload = std::move(env.payload);
    resp.meta = std::move(env.meta);
  }
  if (resp.payload.size() >= split_payload_bytes) {  // a large payload is not copied into the frame
    const auto id = resp.id;
    const std::size_t bytes = resp.payload.size();
    if (send_large(c, frame_kind::response, std::move(resp), d)) return;
    resp = rpc_response{id, static_cast<std::uint8_t>(errc::remote_exception),
                        "worker " + cfg_.me.name + ": the result (" + std::to_string(bytes) + " bytes encoded) is more than one message carries (" +
                            std::to_string(max_body()) + " bytes)",
                        {}, {}};
  }
  auto& frame = scratch_frame();
  if (!append_frame(frame, frame_kind::response, resp)) return;  // cannot happen: bytes and strings only
  send_frame(c, frame, d);
}

void direct_channel::on_response(const std::shared_ptr<channel_conn>& c, rpc_response resp) {
  if (cfg_.hook) {
    envelope env{message_kind::rpc_response, c->peer, cfg_.me.name, resp.id, {}, std::move(resp.payload), std::move(resp.meta)};
    const auto d = cfg_.hook->on_receive(env);
    if (d.copies <= 0) return;
    resp.payload = std::move(env.payload);
    resp.meta = std::move(env.meta);
    if (d.delay.count() > 0) {
      later(d.delay, [self = shared_from_this(), c, resp = std::move(resp)]() mutable {
        self->finish(c.get(), resp.id, static_cast<errc>(resp.code), std::move(resp.message), std::move(resp.payload), std::move(resp.meta));
      });
      return;
    }
  }
  finish(c.get(), resp.id, static_cast<errc>(resp.code), std::move(resp.message), std::move(resp.payload), std::move(resp.meta));
}

void direct_channel::finish(const channel_conn* c, std::uint64_t id, errc code, std::string msg, std::vector<char> payload, std::vector<char> meta) {
  std::shared_ptr<rpc::detail::call_state> st;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    auto it = pending_.find(id);
    // Late, duplicated, or not sent on this connection (a response can only answer its own call).
    if (it == pending_.end() || it->second.conn != c) return;
    st = std::move(it->second.state);
    deadlines_.erase(it->second.deadline);
    --c->pending_calls;
    if (it->second.unattended) --c->unattended;
    pending_.erase(it);
  }
  if (payload.capacity() >= byte_pool_min_bytes && cfg_.bulk)  // Note [byte pool]: back when the call's state dies
    st->set_recycler([bulk = std::weak_ptr<bulk_names>(cfg_.bulk)](std::vector<char>&& v) {
      if (auto b = bulk.lock()) b->buffers().give(std::move(v));
    });
  st->complete(code, std::move(msg), std::move(payload), std::move(meta));
  if (reading_here_ != c && c->caller_reading.load(std::memory_order_acquire)) {  // it may wait for this very call
    const std::uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(c->reader_wake, &one, sizeof one);
  }
}

void direct_channel::fail_calls_on(const channel_conn* c, const std::string& peer, const std::string& why) {
  std::vector<std::pair<std::uint64_t, std::string>> lost;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    for (const auto& [id, p] : pending_)
      if (p.conn == c) lost.emplace_back(id, p.function);
  }
  for (auto& [id, fn] : lost)
    finish(c, id, errc::peer_lost, "worker " + peer + " was lost (" + why + ") during call to '" + fn + "' from " + cfg_.me.name, {}, {});
}

void direct_channel::sweep_deadlines() {
  const auto now = clock::now();
  std::vector<std::tuple<const channel_conn*, std::uint64_t, std::string>> expired;
  auto collect = [&] {
    expired.clear();
    std::lock_guard<std::mutex> lock(pending_mutex_);
    for (auto it = deadlines_.begin(); it != deadlines_.end() && it->first <= now; ++it) {
      const auto& p = pending_.at(it->second);
      expired.emplace_back(p.conn, it->second, p.state->what());
    }
  };
  collect();
  if (expired.empty()) return;
  // A response may sit unread in a socket whose caller has not waited yet: read those first.
  std::vector<std::shared_ptr<channel_conn>> unread;
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    for (auto& c : conns_)
      if (c->outgoing() && std::any_of(expired.begin(), expired.end(), [&](const auto& e) { return std::get<0>(e) == c.get(); }))
        unread.push_back(c);
  }
  for (auto& c : unread) read_for_io(c);
  collect();
  for (auto& [c, id, what] : expired) finish(c, id, errc::timeout, what + ": no answer by the deadline", {}, {});
}

}  // namespace troupe::detail
