// The release of a context on every worker involved (Note [context actor] in context_actor.hpp):
// dropping it here, handing it to the context's actor, and serving a peer's release (the
// service's handler, Note [dist autograd service]).
#include <caf/all.hpp>

#include "container_impl.hpp"
#include "context_actor.hpp"
#include "direct_requester.hpp"
#include "service.hpp"
#include "troupe/actors/error_caf.hpp"
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
