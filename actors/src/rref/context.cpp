// rref_context, the public face of a node's RRef protocol (troupe/actors/rref/context.hpp): its
// queries, remote(), make_rref and method leases (Note [RRef protocol]). The router behind it is
// context_impl (context_impl.hpp).
#include <caf/all.hpp>

#include "context_impl.hpp"
#include "troupe/actors/rpc/api.hpp"

namespace troupe {

rref_context::rref_context(node& n, rref_options opts) : impl_(std::make_shared<rref_detail::context_impl>(n, opts)) {
  impl_->start();
}

rref_context::~rref_context() { impl_->close(); }

node& rref_context::this_node() { return *impl_->n_; }
const std::string& rref_context::name() const { return impl_->me_; }

std::size_t rref_context::owner_count() const {
  std::lock_guard<std::mutex> lock(impl_->mutex_);
  return impl_->owners_.size();
}

std::size_t rref_context::user_count() const {
  std::lock_guard<std::mutex> lock(impl_->mutex_);
  return impl_->users_.size();
}

std::size_t rref_context::in_flight() const { return static_cast<std::size_t>(std::max<std::int64_t>(0, impl_->in_flight_.load())); }

std::size_t rref_context::tombstone_count() const { return impl_->tombstone_count(); }

rref_stats rref_context::stats() const {
  const auto& s = impl_->stats_;
  return rref_stats{s.remote_calls, s.fork_requests, s.child_acks, s.user_deletes, s.fetches, s.retries, s.value_readies};
}

std::vector<std::string> rref_context::leaks() const {
  std::vector<caf::actor> all;
  std::vector<std::string> out;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex_);
    for (auto& [id, e] : impl_->owners_)
      if (e.actor) all.push_back(caf::actor_cast<caf::actor>(e.actor));
      else out.push_back("owner " + id.str() + (e.running ? " (function running)" : " (fetched before its remote_call)"));
    for (auto& [k, a] : impl_->users_) all.push_back(caf::actor_cast<caf::actor>(a));
  }
  for (auto& a : all) {
    auto line = impl_->ask<std::string>(a, std::chrono::milliseconds(1000), rref_msg::summary_atom::value);
    out.push_back(line ? *line : "an actor that did not answer (it ended meanwhile)");
  }
  return out;
}

bool rref_context::wait_quiescent(std::chrono::milliseconds timeout, bool owners_too) const {
  std::unique_lock<std::mutex> lock(impl_->mutex_);
  return impl_->changed_.wait_for(lock, timeout, [&] {
    return impl_->users_.empty() && impl_->in_flight_.load() == 0 && (!owners_too || impl_->owners_.empty());
  });
}

void rref_context::shutdown(std::chrono::milliseconds timeout) {
  if (wait_quiescent(timeout, true)) return;
  std::string list;
  for (const auto& l : leaks()) list += "\n  " + l;
  throw error(errc::timeout, "rref_context shutdown on " + name() + ": RRefs still alive after " +
                                 std::to_string(timeout.count()) + " ms (" + std::to_string(in_flight()) +
                                 " control messages in flight):" + list);
}

std::shared_ptr<rref_detail::handle> rref_context::remote(const std::string& to, const std::string& function,
                                                          const std::function<std::vector<char>(const rpc::codec_context&)>& encode,
                                                          std::chrono::milliseconds timeout) {
  return rref_detail::start_remote(*impl_, to, function, encode, timeout);
}

std::shared_ptr<rref_detail::handle> rref_context::make_local(std::shared_ptr<const rpc::held_value> value) {
  auto& c = *impl_;
  auto h = std::make_shared<rref_detail::handle>();
  h->id = rref_id{c.me_, c.next_id()};
  {
    std::lock_guard<std::mutex> lock(c.mutex_);
    if (c.closed_) throw error(errc::invalid_state, "make_rref on " + c.me_ + ": the rref context is closed");
    auto& e = c.bare_entry(h->id);
    e.started = true;
    e.snapshot = std::make_shared<const rref_detail::published_value>(rref_detail::published_value{0, {}, value});
    e.actor = rref_detail::spawn_owner_rref(c, h->id, rref_detail::owner_start{true, 0, {}, std::move(value), 1, std::nullopt});
  }
  h->ctx = impl_;
  h->owner = c.me_;
  h->owner_local = h->bound = true;
  return h;
}

std::shared_ptr<rref_detail::handle> rref_context::make_local(std::vector<char> value) {
  return make_local(rpc::hold_encoded(std::move(value)));
}

void rref_context::with_held(const rref_id& id, std::chrono::milliseconds timeout,
                             const std::function<void(std::shared_ptr<const rpc::held_value>&)>& fn) {
  auto& c = *impl_;
  // A method call may overtake the remote_call that creates the value: no order is assumed
  // between messages. Its lease parks in the (PENDING) owner actor until the value exists.
  auto a = c.owner_for(id, true);
  if (!a) throw error(errc::invalid_state, "rref " + id.str() + " was deleted by its owner " + c.me_);
  const auto lease = c.next_id();
  auto r = c.ask<rref_msg::held_answer>(*a, timeout, rref_msg::lease_request{lease});
  if (!r) {
    caf::anon_send(*a, rref_msg::lease_return{lease, false, {}});  // give up the lease (granted late or still queued)
    throw error(errc::timeout, "rref " + id.str() + ": no value on owner " + c.me_ + " within " + std::to_string(timeout.count()) + " ms");
  }
  if (r->code != 0) throw error(static_cast<errc>(r->code), r->message);
  auto value = r->value;
  try {
    fn(value);
  } catch (...) {
    caf::anon_send(*a, rref_msg::lease_return{lease, false, {}});
    throw;
  }
  const bool changed = value != r->value;
  caf::anon_send(*a, rref_msg::lease_return{lease, changed, std::move(value)});
}

void rref_context::with_value(const rref_id& id, std::chrono::milliseconds timeout, const std::function<void(std::vector<char>&)>& fn) {
  with_held(id, timeout, [&](std::shared_ptr<const rpc::held_value>& v) {
    std::vector<char> bytes = v->encode(rref_detail::stored_context);  // the stored value is not part of any message
    auto before = bytes;
    fn(bytes);
    if (bytes != before) v = rpc::hold_encoded(std::move(bytes));  // unchanged: the live object stays
  });
}

}  // namespace troupe
