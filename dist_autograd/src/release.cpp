// The release of a context on every worker involved (Note [context actor] in context_actor.hpp):
// dropping it here, the first attempt from the thread that ended the context, and the reserved
// function that serves it on the other workers.
#include <caf/all.hpp>

#include "container_impl.hpp"
#include "context_actor.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/rpc/registry.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::dist_autograd {

namespace {
constexpr std::size_t max_remembered_releases = 65536;

/// One release attempt to each of `targets` from this thread, awaited together (bounded by
/// release_timeout); returns those that timed out (the actor retries them). A worker that refused
/// or is gone counts as done: nothing is left to release there.
std::set<std::string> first_attempt(node& n, const container_options& opts, context_id id,
                                    const std::set<std::string>& targets) {
  std::vector<std::pair<std::string, rpc::future<std::int32_t>>> calls;
  std::set<std::string> timed_out;
  for (const auto& w : targets) {
    try {
      calls.emplace_back(w, rpc_async<std::int32_t>(n, w, release_name, rpc::deadline{opts.release_timeout}, id,
                                                    n.info().name));
    } catch (const error&) {  // the node is stopping or the peer cannot be resolved
    }
  }
  for (auto& [w, f] : calls) {
    try {
      f.get();  // bounded by the attempt's deadline
    } catch (const error& e) {
      if (e.code() == errc::timeout) timed_out.insert(w);
    }
  }
  return timed_out;
}
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
  const auto left = targets.empty() ? targets : first_attempt(n, opts, id, targets);
  std::set<std::string> done;
  for (const auto& w : targets)
    if (!left.count(w)) done.insert(w);
  if (left.empty()) return caf::anon_send(a, ctx_release{except, true, nullptr, std::move(done)});  // it just ends
  release_through(opts, a, except, /*final=*/true, std::move(done));
}

void add_release_function(const std::shared_ptr<container::impl>& c) {
  std::weak_ptr<container::impl> weak = c;
  c->n.functions().add(release_name, [weak](std::uint64_t id, std::string from) {
    auto self = weak.lock();
    const bool forward = self && !self->release_targets(id, from).empty();
    auto a = self ? caf::actor_cast<context_handle>(self->drop(id)) : context_handle{};
    if (!a || !forward) {  // nothing to forward (or unknown here): answer now, the actor just ends
      if (a) caf::anon_send(a, ctx_release{from, true, nullptr, {}});
      return std::int32_t{0};
    }
    // Its own peers through its actor (retried on timers); the reply waits for them, deferred, so
    // no executor thread waits for another worker (Note [deferred reply]).
    auto reply = rpc::defer();
    caf::anon_send(a, ctx_release{from, true, std::make_shared<answer_once<std::int32_t>>(
                                                  [reply](const std::int32_t&) { reply->complete<std::int32_t>(0); }, 0),
                                  {}});
    return std::int32_t{0};  // ignored: the deferred reply answers
  });
}

}  // namespace troupe::dist_autograd
