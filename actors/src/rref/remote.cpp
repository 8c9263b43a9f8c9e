// remote(), to_here() and local_value() (Note [RRef protocol] in rref/context.hpp).
#include "context_impl.hpp"
#include "troupe/actors/rpc/api.hpp"

namespace troupe::rref_detail {

namespace {

[[noreturn]] void rethrow_for_owner(const error& e, const handle& h, const char* op) {
  if (e.code() != errc::peer_lost) throw;
  h.ctx->mark_lost(h.owner);
  throw error(errc::owner_lost, std::string(op) + " of rref " + h.id.str() + ": owner " + h.owner + " is lost (" + e.message() + ")");
  throw;
}

std::vector<char> copy_local(const handle& h, std::chrono::milliseconds timeout) {
  auto& c = *h.ctx;
  std::unique_lock<std::mutex> lock(c.mutex_);
  if (!c.changed_.wait_for(lock, timeout, [&] { return !c.owners_.count(h.id) || c.owners_[h.id].ready; }))
    throw error(errc::timeout, "to_here of rref " + h.id.str() + ": no value on owner " + c.me_ + " within " + std::to_string(timeout.count()) + " ms");
  auto it = c.owners_.find(h.id);
  if (it == c.owners_.end()) throw error(errc::invalid_state, "rref " + h.id.str() + " was deleted by its owner " + c.me_);
  if (it->second.code != errc::ok) throw error(it->second.code, it->second.message);
  return it->second.value;
}

void check_usable(const handle& h, const char* op) {
  if (!h.bound || !h.ctx)
    throw error(errc::invalid_state, std::string(op) + " of rref " + h.pending.id.str() +
                                         ": the rref was received outside an rref_context (use rref_context::add / rpc_sync)");
  if (h.failed != errc::ok) throw error(h.failed, h.failure);
  if (h.owner_local) return;
  std::lock_guard<std::mutex> lock(h.ctx->mutex_);
  auto it = h.ctx->users_.find({h.id, h.fork});
  if (it != h.ctx->users_.end() && it->second.failed != errc::ok) throw error(it->second.failed, it->second.failure);
}

}  // namespace

void check_owner(const handle& h, const char* op) {
  if (h.ctx && h.ctx->is_lost(h.owner))
    throw error(errc::owner_lost, std::string(op) + " of rref " + h.id.str() + ": owner " + h.owner + " is lost");
}

void note_owner_lost(const handle& h) {
  if (h.ctx) h.ctx->mark_lost(h.owner);
}

std::vector<char> fetch(const handle& h, std::chrono::milliseconds timeout) {
  check_usable(h, "to_here");
  if (h.owner_local) return copy_local(h, timeout);
  check_owner(h, "to_here");
  // The owner waits a little less than we do, so a value that comes late is a clean timeout.
  const auto owner_wait = timeout - std::min(timeout / 10, std::chrono::milliseconds(100));
  try {
    auto [code, message, value] = rpc_sync<fetch_reply>(*h.ctx->n_, h.owner, "troupe.rref.fetch", rpc::deadline{timeout},
                                                         rref_msg::fetch{h.id, owner_wait.count()});
    if (code != 0) throw error(static_cast<errc>(code), message);
    return std::move(value);
  } catch (const error& e) {
    rethrow_for_owner(e, h, "to_here");
  }
}

std::vector<char> local_value(const handle& h) {
  check_usable(h, "local_value");
  if (h.owner != h.ctx->me_)
    throw error(errc::invalid_state, "local_value() of rref " + h.id.str() + " on worker " + h.ctx->me_ +
                                         ": only its owner " + h.owner + " holds the value; use to_here()");
  if (h.owner_local) return copy_local(h, std::chrono::milliseconds(0));
  std::unique_lock<std::mutex> lock(h.ctx->mutex_);
  auto it = h.ctx->owners_.find(h.id);
  if (it == h.ctx->owners_.end() || !it->second.ready)
    throw error(errc::invalid_state, "local_value() of rref " + h.id.str() + ": the value does not exist yet on " + h.ctx->me_);
  if (it->second.code != errc::ok) throw error(it->second.code, it->second.message);
  return it->second.value;
}

}  // namespace troupe::rref_detail

namespace troupe {

std::shared_ptr<rref_detail::handle> rref_context::remote(const std::string& to, const std::string& function,
                                                          std::vector<char> args, std::chrono::milliseconds timeout,
                                                          std::vector<rref_detail::send_scope::sent> carried) {
  return rref_detail::start_remote(*impl_, to, function, std::move(args), timeout, std::move(carried));
}

std::shared_ptr<rref_detail::handle> rref_detail::start_remote(context_impl& c, const std::string& to, const std::string& function,
                                                               std::vector<char> args, std::chrono::milliseconds timeout,
                                                               std::vector<send_scope::sent> carried) {
  auto h = std::make_shared<rref_detail::handle>();
  auto impl_ = c.shared_from_this();
  {
    std::lock_guard<std::mutex> lock(c.mutex_);
    if (c.closed_) throw error(errc::invalid_state, "remote() on " + c.me_ + ": the rref context is closed");
    h->id = rref_id{c.me_, c.next_++};
    h->fork = fork_id{h->id.creator, h->id.local};  // the creator fork (Note [RRef protocol])
    auto& e = c.users_[{h->id, h->fork}];
    e.owner = to;
    e.holds = 1;
    ++c.stats_.remote_calls;
    ++c.in_flight_;
  }
  h->ctx = impl_;
  h->owner = to;
  h->bound = true;
  const rref_detail::fork_key k{h->id, h->fork};
  std::weak_ptr<rref_detail::context_impl> weak = impl_;
  auto done = [weak, k, to, carried = std::move(carried)](errc code, bool accepted) mutable {
    auto self = weak.lock();
    if (!self) return;
    if (code != errc::ok && !carried.empty()) rref_detail::probe(*self, to, std::move(carried));
    if (code == errc::ok) self->confirm(k, accepted ? errc::ok : errc::invalid_state, "rref " + k.first.str() + " was deleted by its owner " + to);
    else if (code == errc::peer_lost) self->confirm(k, errc::owner_lost, "owner " + to + " of rref " + k.first.str() + " is lost");
    else self->send_fork_request(k);  // the call or its reply may be lost: confirm by a retried fork_request
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      --self->in_flight_;
    }
    self->changed_.notify_all();
  };
  auto f = rpc_async<bool>(*c.n_, to, "troupe.rref.remote_call", rpc::deadline{timeout},
                           rref_msg::remote_call{h->id, h->fork, function, std::move(args)});
  f.then([done](const rpc::future<bool>& r) mutable {
    try {
      done(errc::ok, r.get());
    } catch (const error& e) {
      done(e.code(), false);
    }
  });
  return h;
}

}  // namespace troupe
