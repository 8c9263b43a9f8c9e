// rref_context: registration, the retry timer, control messages and the public queries
// (Note [RRef protocol] in rref/context.hpp).
#include <sstream>

#include "context_impl.hpp"
#include "troupe/actors/rpc/api.hpp"

namespace troupe::rref_detail {

namespace {

constexpr auto attempt_timeout = std::chrono::milliseconds(500);
constexpr auto first_backoff = std::chrono::milliseconds(5);
constexpr auto max_backoff = std::chrono::milliseconds(200);

thread_local context_impl* tls_context = nullptr;

// Answers that end the retries: the peer is gone or refused for good.
bool final_failure(errc c) {
  return c == errc::peer_lost || c == errc::invalid_state || c == errc::unauthorized || c == errc::remote_exception ||
         c == errc::bad_argument || c == errc::protocol_violation;
}

template <class R, class Msg>
void serve(node& n, const std::weak_ptr<context_impl>& weak, const std::string& name, R (context_impl::*handler)(const Msg&)) {
  n.functions().add(name, [weak, handler, name](Msg m) -> R {
    auto self = weak.lock();
    if (!self) throw error(errc::invalid_state, name + ": the rref context of this worker is gone");
    binding_scope scope(self.get());
    return (self.get()->*handler)(m);
  });
}

}  // namespace

context_impl* current_context() { return tls_context; }
binding_scope::binding_scope(context_impl* ctx) : previous_(tls_context) { tls_context = ctx; }
binding_scope::~binding_scope() { tls_context = previous_; }

context_impl::context_impl(node& n, rref_options opts)
    : n_(&n), me_(n.info().name),
      result_probe_after_(opts.result_probe_after.count() > 0 ? opts.result_probe_after : 3 * n.default_timeout()) {}

context_impl::~context_impl() { close(); }

void context_impl::start() {
  std::weak_ptr<context_impl> weak = shared_from_this();
  serve(*n_, weak, "troupe.rref.remote_call", &context_impl::on_remote_call);
  serve(*n_, weak, "troupe.rref.fork_request", &context_impl::on_fork_request);
  serve(*n_, weak, "troupe.rref.child_ack", &context_impl::on_child_ack);
  serve(*n_, weak, "troupe.rref.user_delete", &context_impl::on_user_delete);
  serve(*n_, weak, "troupe.rref.fetch", &context_impl::on_fetch);
  serve(*n_, weak, "troupe.rref.fork_probe", &context_impl::on_fork_probe);
  timer_thread_ = std::thread([this] { timer_loop(); });
}

void context_impl::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    closed_ = true;
    timers_.clear();
  }
  changed_.notify_all();
  if (timer_thread_.joinable() && timer_thread_.get_id() != std::this_thread::get_id()) timer_thread_.join();
  else if (timer_thread_.joinable()) timer_thread_.detach();
}

void context_impl::timer_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!closed_) {
    if (timers_.empty()) {
      changed_.wait(lock);
      continue;
    }
    auto first = timers_.begin();
    if (first->first > std::chrono::steady_clock::now()) {
      // A copy: wait_until re-reads its deadline after waking, and the timer's node may be
      // erased (close(), or an earlier timer firing) while the lock is released.
      const auto when = first->first;
      changed_.wait_until(lock, when);
      continue;
    }
    auto fn = std::move(first->second);
    timers_.erase(first);
    lock.unlock();
    fn();
    lock.lock();
  }
}

void context_impl::after(std::chrono::milliseconds d, std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    timers_.emplace(std::chrono::steady_clock::now() + d, std::move(fn));
  }
  changed_.notify_all();
}

template <class Msg>
void context_impl::send_control(const std::string& to, const std::string& fn, const Msg& m,
                                std::function<void(errc, std::vector<char>)> done) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++in_flight_;
  }
  auto finish = [self = shared_from_this(), done = std::move(done)](errc c, std::vector<char> reply) {
    done(c, std::move(reply));
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      --self->in_flight_;
    }
    self->changed_.notify_all();
  };
  send_encoded(to, fn, rpc::encode_args<Msg>(m), std::move(finish), first_backoff);
}

void context_impl::send_encoded(const std::string& to, const std::string& fn, std::vector<char> payload,
                                std::function<void(errc, std::vector<char>)> done, std::chrono::milliseconds backoff) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
  }
  if (is_lost(to)) {
    done(errc::peer_lost, {});
    return;
  }
  std::shared_ptr<rpc::detail::call_state> st;
  try {
    st = n_->call(to, fn, [&] { return payload; }, attempt_timeout);
  } catch (const error& e) {
    if (e.code() == errc::peer_lost) mark_lost(to);
    done(e.code(), {});
    return;
  }
  auto self = shared_from_this();
  st->on_complete([self, st, to, fn, payload = std::move(payload), done = std::move(done), backoff]() mutable {
    try {
      done(errc::ok, st->value());
      return;
    } catch (const error& e) {
      if (final_failure(e.code())) {
        if (e.code() == errc::peer_lost) self->mark_lost(to);
        done(e.code(), {});
        return;
      }
    }
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      ++self->stats_.retries;
    }
    const auto next = std::min(backoff * 2, max_backoff);
    self->after(backoff, [self, to, fn, payload = std::move(payload), done = std::move(done), next]() mutable {
      self->send_encoded(to, fn, std::move(payload), std::move(done), next);
    });
  });
}

// Explicit instantiations for the messages sent from owner.cpp / user.cpp.
template void context_impl::send_control(const std::string&, const std::string&, const rref_msg::fork_request&,
                                         std::function<void(errc, std::vector<char>)>);
template void context_impl::send_control(const std::string&, const std::string&, const rref_msg::child_ack&,
                                         std::function<void(errc, std::vector<char>)>);
template void context_impl::send_control(const std::string&, const std::string&, const rref_msg::fork_probe&,
                                         std::function<void(errc, std::vector<char>)>);
template void context_impl::send_control(const std::string&, const std::string&, const rref_msg::user_delete&,
                                         std::function<void(errc, std::vector<char>)>);

}  // namespace troupe::rref_detail

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

std::size_t rref_context::in_flight() const {
  std::lock_guard<std::mutex> lock(impl_->mutex_);
  return impl_->in_flight_;
}

rref_stats rref_context::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex_);
  return impl_->stats_;
}

std::vector<std::string> rref_context::leaks() const {
  std::lock_guard<std::mutex> lock(impl_->mutex_);
  std::vector<std::string> out;
  for (const auto& [id, e] : impl_->owners_) {
    std::ostringstream s;
    s << "owner " << id.str() << " (forks {";
    for (const auto& f : e.forks) s << " " << f.str();
    s << " }, local refs " << e.local << ", pending children " << e.children.size() << ")";
    out.push_back(s.str());
  }
  for (const auto& [k, e] : impl_->users_)
    out.push_back("user " + k.first.str() + " fork " + k.second.str() + " (owner " + e.owner + ", holds " +
                  std::to_string(e.holds) + (e.confirmed ? ", confirmed)" : ", unconfirmed)"));
  return out;
}

bool rref_context::wait_quiescent(std::chrono::milliseconds timeout, bool owners_too) const {
  std::unique_lock<std::mutex> lock(impl_->mutex_);
  return impl_->changed_.wait_for(lock, timeout, [&] {
    return impl_->users_.empty() && impl_->in_flight_ == 0 && (!owners_too || impl_->owners_.empty());
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

}  // namespace troupe
