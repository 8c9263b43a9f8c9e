// The direct RPC channel, caller side of waiting: a caller that waits for its call reads the
// connection itself (Note [direct channel], "the caller reads its own response").
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "rpc/direct_channel.hpp"

namespace troupe::detail {

namespace {

using clock = std::chrono::steady_clock;

void drain(int eventfd) {
  std::uint64_t n = 0;
  [[maybe_unused]] auto r = ::read(eventfd, &n, sizeof n);
}

// One per outgoing connection: the calls on it are helped by reading it (or by the I/O thread).
class conn_helper final : public rpc::detail::call_helper {
 public:
  conn_helper(std::weak_ptr<direct_channel> path, std::weak_ptr<channel_conn> conn) : path_(std::move(path)), conn_(std::move(conn)) {}
  void wait(const rpc::detail::call_state& st, clock::time_point until) override {
    auto s = path_.lock();
    auto c = conn_.lock();
    if (s && c) s->read_until_done(c, st, until);
  }
  void unattended(std::uint64_t id) override {
    auto s = path_.lock();
    auto c = conn_.lock();
    if (s && c) s->unattend(c.get(), id);
  }

 private:
  std::weak_ptr<direct_channel> path_;
  std::weak_ptr<channel_conn> conn_;
};

}  // namespace

thread_local const channel_conn* direct_channel::reading_here_ = nullptr;

std::shared_ptr<rpc::detail::call_helper> direct_channel::make_waiter(const std::shared_ptr<channel_conn>& c) {
  return std::make_shared<conn_helper>(weak_from_this(), c);
}

// Caller holds pending_mutex_ (the call is not shared yet: nobody can wait on it before).
void direct_channel::install_helper(const std::shared_ptr<channel_conn>& c, rpc::detail::call_state& st, std::uint64_t id) {
  st.set_helper(c->waiter, id);
}

void direct_channel::unattend(const channel_conn* c, std::uint64_t id) {
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    auto it = pending_.find(id);
    if (it == pending_.end() || it->second.conn != c || it->second.unattended) return;
    it->second.unattended = true;
    if (++c->unattended > 1) return;  // the I/O thread already reads this connection
  }
  wake();  // it polls this connection from now on
}

bool direct_channel::io_reads(const channel_conn& c) {
  if (!c.outgoing()) return true;
  if (c.caller_reading.load(std::memory_order_acquire)) return false;
  if (c.actor_traffic.load(std::memory_order_acquire)) return true;  // Note [remote actors]
  std::lock_guard<std::mutex> lock(pending_mutex_);
  if (c.pending_calls == 0) c.handed_over = false;
  return c.unattended > 0 || c.handed_over;
}

bool direct_channel::read_for_io(const std::shared_ptr<channel_conn>& c) {
  if (c->caller_reading.load(std::memory_order_acquire)) return false;
  std::unique_lock<std::mutex> reading(c->read_mutex, std::try_to_lock);
  if (!reading || c->caller_reading.load(std::memory_order_acquire)) return false;
  on_readable(c, nullptr);
  return true;
}

void direct_channel::read_until_done(const std::shared_ptr<channel_conn>& c, const rpc::detail::call_state& st, clock::time_point until) {
  bool idle = false;
  if (stopping_ || c->closed() || !c->caller_reading.compare_exchange_strong(idle, true)) return;
  {
    std::unique_lock<std::mutex> reading(c->read_mutex);  // the I/O thread may be in the middle of a read
    const channel_conn* outer = std::exchange(reading_here_, c.get());
    bool block = true;  // Note [blocking first read]: recv alone until a slice passes without data
    while (!st.done() && !c->closed() && !stopping_) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - clock::now()).count();
      if (left <= 0) break;
      if (block) {
        const auto before = c->bytes_read.load(std::memory_order_relaxed);
        on_readable(c, nullptr, true);
        block = c->bytes_read.load(std::memory_order_relaxed) != before;
        continue;
      }
      pollfd fds[2] = {pollfd{c->fd(), POLLIN, 0}, pollfd{c->reader_wake, POLLIN, 0}};
      if (::poll(fds, 2, static_cast<int>(std::min<long long>(left, max_poll_ms))) < 0 && errno != EINTR) break;
      if (fds[1].revents) drain(c->reader_wake);
      if (fds[0].revents) on_readable(c, nullptr);  // completes every call it reads a response for
    }
    reading_here_ = outer;
  }
  release_reading(c);
}

// Calls still pending on `c` are waited on by threads blocked on their call (or by nobody): the
// I/O thread reads for them from now on.
void direct_channel::release_reading(const std::shared_ptr<channel_conn>& c) {
  c->caller_reading.store(false, std::memory_order_release);
  bool left = false;
  {
    std::lock_guard<std::mutex> lock(pending_mutex_);
    if (c->pending_calls > 0) left = c->handed_over = true;
  }
  if (left || c->actor_traffic.load(std::memory_order_acquire)) wake();
}

// The I/O thread, at most every max_poll_ms: responses of calls whose caller has not waited yet
// (it is busy, or dropped the future) are read and completed within that bound rather than at
// their deadline. (is_ready() marks its call unattended at once: call_state::ready().)
void direct_channel::read_unwaited(const std::vector<std::shared_ptr<channel_conn>>& outgoing) {
  const auto now = clock::now();
  if (now - last_unwaited_read_ < std::chrono::milliseconds(max_poll_ms)) return;
  last_unwaited_read_ = now;
  for (const auto& c : outgoing) {
    bool waiting = false;
    {
      std::lock_guard<std::mutex> lock(pending_mutex_);
      waiting = c->pending_calls > 0;
    }
    if (waiting) read_for_io(c);
  }
}

}  // namespace troupe::detail
