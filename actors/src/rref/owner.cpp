// The owner side of the RRef protocol: OwnerRRef entries, remote_call, fork_request, user_delete
// and fetch (Note [RRef protocol] in rref/context.hpp).
#include "context_impl.hpp"
#include "troupe/actors/rpc/api.hpp"

namespace troupe::rref_detail {

namespace {
constexpr auto max_fetch_wait = std::chrono::milliseconds(60000);

fork_id creator_fork(const rref_id& id) { return fork_id{id.creator, id.local}; }
}  // namespace

owner_entry* context_impl::owner_for(const rref_id& id) {
  if (deleted_owners_.count(id)) return nullptr;
  return &owners_[id];
}

void context_impl::maybe_delete_owner(const rref_id& id) {
  auto it = owners_.find(id);
  if (it == owners_.end()) return;
  const auto& e = it->second;
  if (!e.forks.empty() || e.local > 0 || !e.children.empty()) return;
  if (e.started && !e.ready) return;  // the user function is running; its result lands here
  if (!e.ready && !e.creator_fork_deleted) return;  // the remote_call may still be on its way
  owners_.erase(it);
  deleted_owners_.insert(id);
  changed_.notify_all();
}

bool context_impl::on_remote_call(const rref_msg::remote_call& m) {
  std::shared_ptr<const rpc::function_entry> fn;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto* e = owner_for(m.id);
    if (!e) return false;  // a late duplicate of a call whose RRef is already gone
    if (!deleted_forks_.count({m.id, m.fork})) e->forks.insert(m.fork);
    if (e->started) return true;  // duplicate: the function runs once
    e->started = true;
    fn = n_->functions().find(m.function);
    if (!fn) {
      e->ready = true;
      e->code = errc::unknown_function;
      e->message = "remote() of '" + m.function + "' for rref " + m.id.str() + ": worker " + me_ + " has no such function";
      changed_.notify_all();
      return true;
    }
  }
  errc code = errc::ok;
  std::string message;
  std::vector<char> value;
  try {
    storing_scope storing;  // the result becomes a stored value, fetched by many
    value = fn->invoke(m.args, [] {});
  } catch (const error& e) {
    code = e.code() == errc::bad_argument ? errc::bad_argument : errc::remote_exception;
    message = "remote() of '" + m.function + "' on worker " + me_ + " (rref " + m.id.str() + ") threw: " + e.what();
  } catch (const std::exception& e) {
    code = errc::remote_exception;
    message = "remote() of '" + m.function + "' on worker " + me_ + " (rref " + m.id.str() + ") threw: " + e.what();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = owners_.find(m.id);
  if (it != owners_.end()) {
    it->second.ready = true;
    it->second.code = code;
    it->second.message = std::move(message);
    it->second.value = std::move(value);
    changed_.notify_all();
    maybe_delete_owner(m.id);
  }
  return true;
}

std::int32_t context_impl::on_fork_request(const rref_msg::fork_request& m) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (deleted_forks_.count({m.id, m.fork})) return 0;  // a late duplicate after the fork's delete
  auto* e = owner_for(m.id);
  if (!e) return 1;  // refused: the RRef is gone (never for a live fork, Note [RRef protocol])
  e->forks.insert(m.fork);
  return 0;
}

std::int32_t context_impl::on_user_delete(const rref_msg::user_delete& m) {
  std::lock_guard<std::mutex> lock(mutex_);
  deleted_forks_.insert({m.id, m.fork});
  auto it = owners_.find(m.id);
  if (it == owners_.end()) return 0;
  it->second.forks.erase(m.fork);
  if (m.fork == creator_fork(m.id)) it->second.creator_fork_deleted = true;
  maybe_delete_owner(m.id);
  return 0;
}

fetch_reply context_impl::on_fetch(const rref_msg::fetch& m) {
  // Errors travel as (code, message) so the caller sees timeout / invalid_state / remote_exception
  // as such, not wrapped into a remote_exception of this handler.
  const auto wait = std::min(std::chrono::milliseconds(m.timeout_ms), max_fetch_wait);
  auto fail = [](errc c, std::string msg) { return fetch_reply{static_cast<std::int32_t>(c), std::move(msg), {}}; };
  std::unique_lock<std::mutex> lock(mutex_);
  if (!owner_for(m.id)) return fail(errc::invalid_state, "rref " + m.id.str() + " was deleted by its owner " + me_);
  const bool ready = changed_.wait_for(lock, wait, [&] {
    auto it = owners_.find(m.id);
    return it == owners_.end() || it->second.ready;
  });
  auto it = owners_.find(m.id);
  if (it == owners_.end()) return fail(errc::invalid_state, "rref " + m.id.str() + " was deleted by its owner " + me_);
  if (!ready) return fail(errc::timeout, "to_here of rref " + m.id.str() + ": no value on owner " + me_ + " within " + std::to_string(wait.count()) + " ms");
  if (it->second.code != errc::ok) return fail(it->second.code, it->second.message);
  ++stats_.fetches;
  return fetch_reply{0, {}, it->second.value};
}

}  // namespace troupe::rref_detail

namespace troupe {

std::shared_ptr<rref_detail::handle> rref_context::make_local(std::vector<char> value) {
  auto h = std::make_shared<rref_detail::handle>();
  std::lock_guard<std::mutex> lock(impl_->mutex_);
  h->id = rref_id{impl_->me_, impl_->next_++};
  auto& e = impl_->owners_[h->id];
  e.started = e.ready = true;
  e.value = std::move(value);
  e.local = 1;
  h->ctx = impl_;
  h->owner = impl_->me_;
  h->owner_local = h->bound = true;
  return h;
}

void rref_context::with_value(const rref_id& id, std::chrono::milliseconds timeout, const std::function<void(std::vector<char>&)>& fn) {
  std::unique_lock<std::mutex> lock(impl_->mutex_);
  auto* im = impl_.get();
  // A method call may overtake the remote_call that creates the value (no order is assumed
  // between messages): like a fetch, it parks on a pending entry until the value exists.
  if (!im->owner_for(id)) throw error(errc::invalid_state, "rref " + id.str() + " was deleted by its owner " + im->me_);
  if (!im->changed_.wait_for(lock, timeout, [&] { return !im->owners_.count(id) || im->owners_[id].ready; }))
    throw error(errc::timeout, "rref " + id.str() + ": no value on owner " + im->me_ + " within " + std::to_string(timeout.count()) + " ms");
  auto it = im->owners_.find(id);
  if (it == im->owners_.end()) throw error(errc::invalid_state, "rref " + id.str() + " was deleted by its owner " + im->me_);
  if (it->second.code != errc::ok) throw error(it->second.code, it->second.message);
  fn(it->second.value);
}

}  // namespace troupe
