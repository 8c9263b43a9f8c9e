// container::impl: the contexts of one worker, their records, their actors and peers. It holds
// the handler of PropagateGradients (Note [FAST mode backward] in fast_engine.hpp). It releases
// a context on every worker involved (Note [context actor] in context_actor.hpp). A peer's
// release is served by the service (Note [dist autograd service]).
#include "container_impl.hpp"

#include <algorithm>

#include <caf/all.hpp>

#include "context_actor.hpp"
#include "direct_requester.hpp"
#include "fast_engine.hpp"
#include "nested_run.hpp"
#include "service.hpp"
#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/remote_actor.hpp"
#include "troupe/autograd/autograd_meta.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::dist_autograd {

namespace {

constexpr std::size_t max_remembered_releases = 65536;

/// Whether a direct release attempt's reply says it timed out (no reply counts as timed out).
bool timed_out(const caf::message& reply, const char* what) {
  if (reply.empty()) return true;
  if (!reply.match_elements<caf::error>()) return false;
  return from_caf_error(reply.get_as<caf::error>(0), what).code() == errc::timeout;
}
}  // namespace

propagate_answer first_answer(const caf::message& reply, const std::string& to) {
  if (reply.match_elements<propagate_reply>()) return to_answer(reply.get_as<propagate_reply>(0));
  if (reply.match_elements<caf::error>()) {
    const error e = from_caf_error(reply.get_as<caf::error>(0), "dist_autograd::propagate to " + to);
    return {propagate_attempt_failed, static_cast<std::int32_t>(e.code()), e.message()};
  }
  return {propagate_attempt_failed, static_cast<std::int32_t>(errc::timeout),
          "dist_autograd::propagate to " + to + ": no answer within propagate_timeout"};
}

container::impl::impl(node& nd, container_options o)
    : n(nd), opts(o), worker_bits(static_cast<std::uint64_t>(nd.info().rank) << 48) {}

std::shared_ptr<context_state> container::impl::find_if(context_id id) const {
  std::lock_guard<std::mutex> lock(m);
  auto it = contexts.find(id);
  return it == contexts.end() ? nullptr : it->second;
}

std::shared_ptr<context_state> container::impl::find(context_id id, const char* op) const {
  auto ctx = find_if(id);
  if (!ctx)
    throw error(errc::bad_argument, std::string("dist_autograd::") + op + ": unknown context " + std::to_string(id) +
                                        " on " + n.info().name);
  return ctx;
}

std::shared_ptr<context_state> container::impl::find_or_create(context_id id) {
  std::lock_guard<std::mutex> lock(m);
  if (released.count(id)) return nullptr;
  auto& slot = contexts[id];
  if (!slot) slot = std::make_shared<context_state>(id);  // its actor comes when needed (actor_of)
  return slot;
}

message_id container::impl::record_send(context_state& ctx, const tensor_list& tensors, const std::string& to) {
  edge_list edges;
  std::vector<troupe::device> devices;
  for (const auto& t : tensors) {
    edges.push_back(t.defined() && t.requires_grad() ? gradient_edge(t) : edge{});
    devices.push_back(t.defined() ? t.device() : cpu_device);
  }
  const message_id msg = new_id();
  auto send = std::make_shared<send_function>(std::move(edges), std::move(devices));
  std::lock_guard<std::mutex> lock(ctx.m);
  ctx.sends.emplace(msg, std::move(send));
  ctx.workers.insert(to);
  return msg;
}

std::shared_ptr<recv_function> container::impl::record_recv(context_state& ctx, message_id msg,
                                                             const std::string& from, std::uint32_t num) {
  std::weak_ptr<impl> weak = weak_from_this();
  auto propagate = [weak, id = ctx.id, msg, from](const tensor_list& grads, const run_info* run) {
    auto self = weak.lock();
    if (!run || !run->outbox || !self) throw error(errc::invalid_state, "dist_autograd: a recv function ran outside a distributed backward");
    // Note [context actor]: the actor sends it at once (the local run goes on meanwhile); the
    // run's caller awaits the run's propagations there.
    caf::actor peer = self->peer(from);
    if (auto* direct = run->outbox->direct) {  // Note [direct requests]: attempt 1 goes from here
      const std::size_t slot = direct->send(
          *self->requester, peer, caf::make_message(propagate_request{id, msg, run->pass, 1, run->retain, grads}));
      run->outbox->sent.push_back({{self->new_id(), from, std::move(peer), msg, grads}, slot});
      return;
    }
    // A served run (on the service's thread): attempt 1 goes from here; the run's answer waits
    // for its reply without the actor unless it is not done.
    if (auto* nested = run->outbox->nested) return nested->send(from, std::move(peer), msg, grads);
    throw error(errc::invalid_state, "dist_autograd: a recv function ran outside a distributed backward");
  };
  auto recv = std::make_shared<recv_function>(num, from, std::move(propagate));
  std::lock_guard<std::mutex> lock(ctx.m);
  ctx.recvs.emplace(msg, recv);
  ctx.workers.insert(from);
  return recv;
}

caf::actor container::impl::actor_of(context_id id) {
  std::lock_guard<std::mutex> lock(m);
  auto ctx = contexts.find(id);
  if (ctx == contexts.end()) return {};
  auto& a = actors[id];
  if (!a) a = caf::actor_cast<caf::actor>(spawn_context_actor(n, opts, ctx->second));
  return a;
}

caf::actor container::impl::peer(const std::string& worker) {
  if (worker == n.info().name) return service;
  {
    std::lock_guard<std::mutex> lock(peers_m);
    if (auto it = peers.find(worker); it != peers.end()) return it->second;
  }
  // Note [dist autograd service]: one lookup per worker; a handle that went down stays (its
  // requests fail at once with the cause).
  auto h = caf::actor_cast<caf::actor>(lookup_actor<service_actor>(n, worker, service_name, opts.release_timeout));
  std::lock_guard<std::mutex> lock(peers_m);
  return peers.emplace(worker, std::move(h)).first->second;
}

std::map<std::string, caf::actor> container::impl::peers_of(const std::set<std::string>& workers) {
  std::map<std::string, caf::actor> out;
  for (const auto& w : workers) {
    try {
      out.emplace(w, peer(w));
    } catch (const error&) {  // gone or without a container: nothing to release there
    }
  }
  return out;
}

// ---- PropagateGradients ----------------------------------------------------------------------

namespace {
/// The answer that carries the current exception's code and text.
propagate_answer failed_answer(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const error& err) {
    return propagation_failure(err.code(), err.message());
  } catch (const std::exception& err) {
    return propagation_failure(errc::remote_exception, err.what());
  } catch (...) {
    return propagation_failure(errc::remote_exception, "unknown exception");
  }
}

/// The send function of `msg` in `ctx`, checked against the gradients that arrived.
std::shared_ptr<send_function> send_for(context_state& ctx, message_id msg, const tensor_list& grads,
                                        const std::string& me) {
  std::shared_ptr<send_function> send;
  {
    std::lock_guard<std::mutex> lock(ctx.m);
    if (auto it = ctx.sends.find(msg); it != ctx.sends.end()) send = it->second;
  }
  if (!send)
    throw error(errc::bad_argument, "dist_autograd::propagate on " + me + ": no send function for message " +
                                        std::to_string(msg) + " in context " + std::to_string(ctx.id));
  if (grads.size() != send->next_edges().size())
    throw error(errc::bad_argument, "dist_autograd::propagate on " + me + ": " + std::to_string(grads.size()) +
                                        " gradients for a send of " + std::to_string(send->next_edges().size()) +
                                        " tensors");
  return send;
}
}  // namespace

void container::impl::on_propagate(context_id id, message_id msg, std::uint64_t pass, const tensor_list& grads,
                                   bool retain, answer_ptr<propagate_answer> done) {
  auto ctx = find_if(id);
  if (!ctx)
    return (*done)(propagation_failure(errc::bad_argument,
                           "dist_autograd::propagate: unknown context " + std::to_string(id) + " on " + n.info().name));
  const std::pair<message_id, std::uint64_t> key{msg, pass};
  {  // a retry or duplicate: the outcome if the record has it, else the actor answers it
    std::unique_lock<std::mutex> lock(ctx->m);
    auto [it, first] = ctx->handled.try_emplace(key);
    if (!first) {
      if (it->second.known) {
        const propagate_answer known = it->second.outcome;
        lock.unlock();
        return (*done)(known);
      }
      it->second.parked = true;
      lock.unlock();
      // Released meanwhile (no actor): `done` is dropped and answers its fallback.
      return caf::anon_send(caf::actor_cast<context_handle>(actor_of(id)), ctx_duplicate{key, std::move(done)});
    }
  }
  // Note [direct requests]: the run's propagations answer to `nested`, which answers `done`.
  auto nested = std::make_shared<nested_run>(weak_from_this(), ctx, new_id(), pass, retain);
  propagation_outbox outbox{caf::actor{}, 0, 0, nullptr, {}};
  outbox.nested = nested.get();
  propagate_answer local{propagate_done, 0, {}};
  try {  // the local part runs here; what it started is awaited by `nested`, not here
    execute_fast(*ctx, pass, retain, send_for(*ctx, msg, grads, n.info().name), grads, outbox);
  } catch (...) {
    local = failed_answer(std::current_exception());
  }
  nested->close(std::move(local), key, std::move(done));
}

// ---- release ---------------------------------------------------------------------------------

std::shared_ptr<context_state> container::impl::drop(context_id id, caf::actor& actor) {
  std::lock_guard<std::mutex> lock(m);
  if (released.insert(id).second) {
    released_order.push_back(id);
    if (released_order.size() > max_remembered_releases) {
      released.erase(released_order.front());
      released_order.pop_front();
    }
  }
  auto ctx = contexts.find(id);
  if (ctx == contexts.end()) return nullptr;
  auto record = std::move(ctx->second);
  contexts.erase(ctx);
  if (auto it = actors.find(id); it != actors.end()) {
    actor = std::move(it->second);
    actors.erase(it);
  }
  return record;
}

std::set<std::string> container::impl::release_targets(context_id id, const std::string& except) const {
  std::set<std::string> out;
  auto ctx = find_if(id);
  if (!ctx) return out;
  std::lock_guard<std::mutex> lock(ctx->m);
  for (const auto& w : ctx->workers)
    if (w != except && !ctx->lost.count(w)) out.insert(w);
  return out;
}

void container::impl::release_everywhere(context_id id, const std::string& except) {
  const auto targets = release_targets(id, except);
  caf::actor actor;
  const auto record = drop(id, actor);
  if (!record) return;
  auto a = caf::actor_cast<context_handle>(actor);
  ctx_release r{except, /*final=*/true, nullptr, {}, {}, {}};
  if (targets.empty()) {
    if (a) caf::anon_send(a, std::move(r));  // it just ends
    return;
  }
  // Note [direct requests]: the first attempts go from here; the actor retries what timed out.
  auto peers = peers_of(targets);
  reply_batch batch;
  std::vector<std::string> sent;
  for (const auto& [w, h] : peers) {
    batch.send(*requester, h, caf::make_message(release_request{id, n.info().name}));
    sent.push_back(w);
  }
  const auto replies = batch.wait_until(*requester, std::chrono::steady_clock::now() + opts.release_timeout);
  r.settled = targets;  // a worker without a service handle is given up, as the actor does
  for (std::size_t i = 0; i < sent.size(); ++i)
    if (timed_out(replies[i], "release")) {
      r.settled.erase(sent[i]);
      r.retry.insert(sent[i]);
    }
  if (r.retry.empty()) {  // every worker answered: an actor that exists just ends
    if (a) caf::anon_send(a, std::move(r));
    return;
  }
  if (!a) a = spawn_context_actor(n, opts, record);  // the retries are its work
  r.peers = std::move(peers);
  release_through(opts, a, std::move(r));
}

void container::impl::release_async(context_id id) {
  const auto targets = release_targets(id, std::string());
  caf::actor actor;
  const auto record = drop(id, actor);
  if (!record) return;
  // An actor that exists just ends: a retry gets a fresh one (below).
  if (auto a = caf::actor_cast<context_handle>(actor)) caf::anon_send(a, ctx_release{{}, true, nullptr, {}, targets, {}});
  if (targets.empty()) return;
  auto peers = peers_of(targets);  // a worker without a service handle is given up
  {
    std::lock_guard<std::mutex> lock(releasing_m);
    releasing += peers.size();
  }
  const auto deadline = std::chrono::steady_clock::now() + opts.release_timeout;
  for (const auto& [w, h] : peers) {
    auto on_reply = [weak = weak_from_this(), record, targets, w = w, h = h](caf::message&& reply) {
      auto self = weak.lock();
      if (!self) return;
      if (!timed_out(reply, "release") || self->opts.attempts <= 1) return self->release_ended();
      // Attempt 1 timed out: a context actor retries it after a backoff and counts it.
      auto settled = targets;
      settled.erase(w);
      auto done = std::make_shared<answer_once<std::int32_t>>([weak](const std::int32_t&) {
        if (auto s = weak.lock()) s->release_ended();
      }, 0);
      auto a = spawn_context_actor(self->n, self->opts, record);
      {
        std::lock_guard<std::mutex> lock(self->m);  // stopped with the container
        auto& r = self->retrying;
        r.erase(std::remove_if(r.begin(), r.end(), [](const caf::weak_actor_ptr& w) { return !w.lock(); }), r.end());
        r.push_back(caf::actor_cast<caf::weak_actor_ptr>(a));
      }
      caf::anon_send(a, ctx_release{{}, true, std::move(done), {{w, h}}, std::move(settled), {w}});
    };
    requester->request(h, caf::make_message(release_request{id, n.info().name}), std::move(on_reply), deadline);
  }
}

void container::impl::release_ended() {
  {
    std::lock_guard<std::mutex> lock(releasing_m);
    if (releasing > 0) --releasing;
  }
  releasing_cv.notify_all();
}

bool container::impl::await_releases(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(releasing_m);
  return releasing_cv.wait_for(lock, timeout, [&] { return releasing == 0; });
}

void container::impl::serve_release(context_id id, const std::string& from, answer_ptr<std::int32_t> done) {
  const auto targets = release_targets(id, from);
  caf::actor actor;
  const auto record = drop(id, actor);
  auto a = caf::actor_cast<context_handle>(actor);
  if (!record || targets.empty()) {  // nothing to forward (or unknown here): answer now, an actor just ends
    if (a) caf::anon_send(a, ctx_release{from, true, nullptr, {}, {}, {}});
    return (*done)(0);
  }
  if (!a) a = spawn_context_actor(n, opts, record);
  // Its own peers through its actor (retried on timers); the answer waits for them.
  caf::anon_send(a, ctx_release{from, true, std::move(done), peers_of(targets), {}, {}});
}

}  // namespace troupe::dist_autograd
