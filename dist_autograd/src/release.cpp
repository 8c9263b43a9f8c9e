// The release of a context on every worker involved (Note [context actor] in context_actor.hpp):
// dropping it here, handing it to the context's actor, and serving a peer's release (the
// service's handler, Note [dist autograd service]).
#include <caf/all.hpp>

#include "container_impl.hpp"
#include "context_actor.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::dist_autograd {

namespace {
constexpr std::size_t max_remembered_releases = 65536;
}  // namespace

caf::actor container::impl::drop(context_id id) {
  std::lock_guard<std::mutex> lock(m);
  if (released.insert(id).second) {
    released_order.push_back(id);
    if (released_order.size() > max_remembered_releases) {
      released.erase(released_order.front());
      released_order.pop_front();
    }
  }
  contexts.erase(id);
  auto it = actors.find(id);
  if (it == actors.end()) return {};
  caf::actor a = std::move(it->second);
  actors.erase(it);
  return a;
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
  const auto a = caf::actor_cast<context_handle>(drop(id));
  if (!a) return;
  if (targets.empty()) return caf::anon_send(a, ctx_release{except, true, nullptr, {}});  // it just ends
  release_through(opts, a, except, /*final=*/true, peers_of(targets));
}

void container::impl::serve_release(context_id id, const std::string& from, answer_ptr<std::int32_t> done) {
  const auto targets = release_targets(id, from);
  const auto a = caf::actor_cast<context_handle>(drop(id));
  if (!a || targets.empty()) {  // nothing to forward (or unknown here): answer now, the actor just ends
    if (a) caf::anon_send(a, ctx_release{from, true, nullptr, {}});
    return (*done)(0);
  }
  // Its own peers through its actor (retried on timers); the answer waits for them.
  caf::anon_send(a, ctx_release{from, true, std::move(done), peers_of(targets)});
}

}  // namespace troupe::dist_autograd
