// The direct RPC channel (Note [direct channel] in rpc/direct_channel.hpp): its connections and
// who reads each (the I/O thread, the executor's leader, a waiting caller).
#include "rpc/direct_channel.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <iterator>
#include <utility>

#include "rpc/dial.hpp"
#include "rpc/wire.hpp"
#include "tls_relay.hpp"

namespace troupe::detail {

namespace {

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

direct_channel::direct_channel(direct_channel_config cfg)
    : cfg_(std::move(cfg)),
      listener_(cfg_.me.name, cfg_.listen_addr, cfg_.auth_deadline, cfg_.max_unauthenticated, cfg_.tls),
      wake_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      lead_wake_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)),
      sender_(cfg_.bulk, max_body(), later_fn()),
      server_(cfg_, sender_, later_fn()),
      actors_(cfg_.me.name, cfg_.hook, sender_, later_fn(), [this] { wake(); }, max_body()),
      client_(cfg_, sender_, later_fn(), wake_fd_, std::chrono::milliseconds(max_poll_ms)),
      reader_(
          cfg_, listener_, server_, client_, actors_, max_body(), [this](const std::shared_ptr<channel_conn>& c, const std::string& why) { drop(c, why); },
          [this](channel_conn& c, channel_listener::ticket&& t, bool shm_ok) { admit(c, std::move(t), shm_ok); }) {}

direct_channel::~direct_channel() {
  stop();
  ::close(wake_fd_);
  ::close(lead_wake_fd_);
}

void direct_channel::start() {
  server_.set_owner(weak_from_this());
  client_.set_owner(weak_from_this());
  io_ = std::thread([this] { run(); });
  cfg_.exec->set_source(this);
}

void direct_channel::wake() {
  const std::uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(wake_fd_, &one, sizeof one);
}

void direct_channel::interrupt() {
  lead_interrupted_.store(true);
  const std::uint64_t one = 1;
  [[maybe_unused]] auto r = ::write(lead_wake_fd_, &one, sizeof one);
}

void direct_channel::lead(led_jobs& jobs) {
  if (conns_gen_.load(std::memory_order_acquire) != led_gen_) {  // the connections changed: list them again
    std::lock_guard<std::mutex> lock(conns_mutex_);
    led_conns_.clear();
    for (auto& c : conns_)
      if (c->led) led_conns_.push_back(c);
    led_gen_ = conns_gen_.load(std::memory_order_relaxed);
  }
  const auto& polled = led_conns_;
  // Note [blocking first read]: one connection and no interrupt pending: wait in its recv.
  if (polled.size() == 1 && !lead_interrupted_.load()) {
    const auto& c = polled.front();
    const auto before = c->bytes_read.load(std::memory_order_relaxed);
    on_readable(c, &jobs, true);
    if (c->bytes_read.load(std::memory_order_relaxed) != before || c->closed()) return read_on(polled, jobs);
  }
  std::vector<pollfd> fds{pollfd{lead_wake_fd_, POLLIN, 0}};
  for (auto& c : polled) fds.push_back(pollfd{c->fd(), POLLIN, 0});
  if (::poll(fds.data(), fds.size(), max_poll_ms) <= 0) return;
  if (fds[0].revents) {
    lead_interrupted_.store(false);
    std::uint64_t n = 0;
    [[maybe_unused]] auto r = ::read(lead_wake_fd_, &n, sizeof n);
  }
  for (std::size_t i = 0; i < polled.size(); ++i)
    if (fds[i + 1].revents) on_readable(polled[i], &jobs);
  read_on(polled, jobs);
}

// Note [lead through a large message]: a round that only read a message's data (its budget,
// max_read_bytes, used up: Note [fragments]) made no job. Returning then would have the executor
// wake a follower to lead, a thread switch per MiB of a large message. So the leader reads on
// while that holds. Between rounds it watches every led connection and its interrupt (poll, no
// wait). It returns as soon as a round makes a job, an interrupt comes, or nothing is left to
// read. So a small call between fragments is served at once.
void direct_channel::read_on(const std::vector<std::shared_ptr<channel_conn>>& polled, led_jobs& jobs) {
  std::vector<pollfd> fds;
  while (jobs.jobs.empty() && jobs.quick.empty() && !lead_interrupted_.load()) {
    if (std::none_of(polled.begin(), polled.end(), [](const auto& c) { return c->more_to_read && !c->closed(); })) return;
    fds.assign(1, pollfd{lead_wake_fd_, POLLIN, 0});
    for (auto& c : polled) fds.push_back(pollfd{c->fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 0) < 0 || fds[0].revents) return;  // the interrupt: lead() sees it next time
    for (std::size_t i = 0; i < polled.size(); ++i)
      if (!polled[i]->closed() && (polled[i]->more_to_read || fds[i + 1].revents)) on_readable(polled[i], &jobs);
  }
}

std::string direct_channel::issue_ticket(const std::string& peer, const caf::node_id& node) { return listener_.issue_ticket(peer, node); }

std::shared_ptr<channel_conn> direct_channel::connect(const std::string& peer, const caf::node_id& node, const std::string& host,
                                              std::uint16_t port, const std::string& secret, bool shm_ok, std::chrono::milliseconds timeout) {
  int fd = dial_tcp(host, port, timeout);
  if (fd < 0) throw error(errc::peer_lost, cfg_.me.name + ": cannot open the direct rpc connection to " + peer + " at " + host + ":" + std::to_string(port));
  if (cfg_.tls) fd = cfg_.tls->connect(fd, "the direct rpc port of " + peer + " at " + host + ":" + std::to_string(port), clock::now() + timeout);
  auto c = std::make_shared<channel_conn>(fd, true);
  c->waiter = make_waiter(c);
  c->peer = peer;
  c->peer_node = node;
  std::vector<char> frame;
  channel_auth auth{cfg_.me.name, secret, shm_ok};
  if (!append_frame(frame, frame_kind::auth, auth) || !c->write(frame.data(), frame.size()))
    throw error(errc::peer_lost, cfg_.me.name + ": the direct rpc connection to " + peer + " failed during authentication");
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    if (stopping_) throw error(errc::invalid_state, cfg_.me.name + " is shutting down");
    conns_.push_back(c);
    conns_gen_.fetch_add(1, std::memory_order_release);
  }
  wake();  // the I/O thread polls the new connection from now on
  return c;
}

void direct_channel::stop() {
  if (stopping_.exchange(true)) return;
  cfg_.exec->set_source(nullptr);  // no executor thread leads on our sockets from now on
  led_conns_.clear();
  wake();
  if (io_.joinable()) io_.join();
  std::vector<std::shared_ptr<channel_conn>> conns;
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    conns.swap(conns_);
    conns_gen_.fetch_add(1, std::memory_order_release);
  }
  listener_.clear_tickets();
  for (auto& c : conns) c->close();
  sender_.stop();  // queued large writes fail at once on the closed connections
  timers_.clear();
  for (auto& st : client_.table().close()) st->complete(errc::invalid_state, st->what() + ": node " + cfg_.me.name + " shut down", {});
}

void direct_channel::peer_down(const std::string& peer, const std::string& reason) {
  std::vector<std::shared_ptr<channel_conn>> gone;
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    for (auto& c : conns_)
      if (c->peer == peer) gone.push_back(c);
  }
  for (auto& c : gone) {
    c->close();
    client_.table().fail_on(c.get(), peer, reason, cfg_.me.name);
    notify_lost(c, reason);
    // Note [tensor over shared memory]: what the peer held is freed when no local tensor views it.
    if (cfg_.bulk && c->peer_node) cfg_.bulk->drop_peer(caf::to_string(c->peer_node));
  }
}

void direct_channel::drop(const std::shared_ptr<channel_conn>& c, const std::string& why) {
  c->close();
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    std::erase(conns_, c);
    conns_gen_.fetch_add(1, std::memory_order_release);
  }
  if (c->outgoing()) client_.table().fail_on(c.get(), c->peer, why, cfg_.me.name);
  notify_lost(c, why);
}

frame_sender::later_fn direct_channel::later_fn() {
  return [this](std::chrono::milliseconds delay, std::function<void()> fn) { later(delay, std::move(fn)); };
}

void direct_channel::later(std::chrono::milliseconds delay, std::function<void()> fn) {
  timers_.add(clock::now() + delay, std::move(fn));
  wake();
}

int direct_channel::poll_timeout_ms() {
  auto next = clock::now() + std::chrono::milliseconds(max_poll_ms);
  next = timers_.next(next);
  next = client_.table().next_deadline(next);
  next = listener_.next(next);
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(next - clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, max_poll_ms));
}

// Note [connection hygiene] (rpc/accept_guard.hpp).
void direct_channel::accept_all() {
  std::vector<std::shared_ptr<channel_conn>> fresh, evicted;
  listener_.accept_all(fresh, evicted);
  for (auto& c : evicted) drop(c, "unauthenticated beyond the cap");
  if (fresh.empty()) return;
  std::lock_guard<std::mutex> lock(conns_mutex_);
  for (auto& c : fresh) conns_.push_back(std::move(c));
  conns_gen_.fetch_add(1, std::memory_order_release);
}

void direct_channel::expire_waiting() {
  std::vector<std::shared_ptr<channel_conn>> late;
  listener_.expire(late);
  for (auto& c : late) drop(c, "did not authenticate in time");
}

void direct_channel::run() {
  std::vector<pollfd> fds;
  std::vector<std::shared_ptr<channel_conn>> polled, outgoing;
  while (!stopping_) {
    {
      std::lock_guard<std::mutex> lock(conns_mutex_);
      polled.clear();
      for (auto& c : conns_)
        if (!c->led) polled.push_back(c);  // the executor's leader reads the others
    }
    outgoing.clear();
    std::copy_if(polled.begin(), polled.end(), std::back_inserter(outgoing), [](const auto& c) { return c->outgoing(); });
    std::erase_if(polled, [&](const auto& c) { return !io_reads(*c); });  // a waiting caller reads it
    // Note [connection hygiene]: the listener is not polled while accepting backs off.
    fds.assign({pollfd{wake_fd_, POLLIN, 0}, pollfd{listener_.poll_fd(clock::now()), POLLIN, 0}});
    for (auto& c : polled) fds.push_back(pollfd{c->fd(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), poll_timeout_ms()) < 0 && errno != EINTR) break;
    if (fds[0].revents) {
      std::uint64_t n = 0;
      [[maybe_unused]] auto r = ::read(wake_fd_, &n, sizeof n);
    }
    if (fds[1].revents) accept_all();
    for (std::size_t i = 0; i < polled.size(); ++i)
      if (fds[i + 2].revents) {
        if (polled[i]->outgoing()) read_for_io(polled[i]);
        else on_readable(polled[i], nullptr);
      }
    expire_waiting();
    timers_.run_due();
    sweep_deadlines();
    read_unwaited(outgoing);
    if (cfg_.bulk) cfg_.bulk->sweep_pins();  // Note [tensor over shared memory]: shared tensors mapped by now
  }
}

void direct_channel::on_readable(const std::shared_ptr<channel_conn>& c, job_list* jobs, bool block_first) {
  if (!reader_.read(c, jobs, block_first)) return;
  if (c->authed && !c->outgoing() && !c->led) {  // hand the connection (and its buffer) to the leader
    {
      std::lock_guard<std::mutex> lock(conns_mutex_);
      c->led = true;
      conns_gen_.fetch_add(1, std::memory_order_release);
    }
    interrupt();
  }
}

void direct_channel::admit(channel_conn& c, channel_listener::ticket&& t, bool shm_ok) {
  std::lock_guard<std::mutex> lock(conns_mutex_);  // the peer of a connection that authenticates
  c.peer = std::move(t.peer);
  c.peer_node = t.node;
  if (cfg_.bulk) cfg_.bulk->set_reachable(caf::to_string(c.peer_node), shm_ok);  // Note [shm reachability]
}

void direct_channel::call(const std::shared_ptr<channel_conn>& c, const std::shared_ptr<rpc::detail::call_state>& st,
                          const std::string& function, std::vector<char> payload, std::vector<char> meta,
                          rpc::detail::borrowed_parts borrowed) {
  client_.call(c, st, function, std::move(payload), std::move(meta), stopping_.load(), std::move(borrowed));
}

void direct_channel::sweep_deadlines() {
  const auto now = clock::now();
  std::vector<call_table::expired_call> expired;
  client_.table().expired(now, expired);
  if (expired.empty()) return;
  // A response may sit unread in a socket whose caller has not waited yet: read those first.
  std::vector<std::shared_ptr<channel_conn>> unread;
  {
    std::lock_guard<std::mutex> lock(conns_mutex_);
    for (auto& c : conns_)
      if (c->outgoing() && std::any_of(expired.begin(), expired.end(), [&](const auto& e) { return e.conn == c.get(); }))
        unread.push_back(c);
  }
  for (auto& c : unread) read_for_io(c);
  client_.table().expired(now, expired);
  for (auto& e : expired) client_.table().finish(e.conn, e.id, errc::timeout, e.what + ": no answer by the deadline", {}, {});
}

std::shared_ptr<rpc::detail::call_helper> direct_channel::make_waiter(const std::shared_ptr<channel_conn>& c) {
  return std::make_shared<conn_helper>(weak_from_this(), c);
}

void direct_channel::unattend(const channel_conn* c, std::uint64_t id) {
  if (client_.table().unattend(c, id)) wake();  // the I/O thread polls this connection from now on
}

bool direct_channel::io_reads(const channel_conn& c) {
  if (!c.outgoing()) return true;
  if (c.caller_reading.load(std::memory_order_acquire)) return false;
  if (c.actor_traffic.load(std::memory_order_acquire)) return true;  // Note [remote actors]
  return client_.table().needs_io(c);
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
    read_while(c, [&st] { return st.done(); }, until);
  }
  release_reading(c);
}

bool direct_channel::read_replies(const std::shared_ptr<channel_conn>& c, const std::function<bool()>& done, clock::time_point until) {
  bool idle = false;
  if (!c->outgoing() || stopping_ || c->closed() || !c->caller_reading.compare_exchange_strong(idle, true)) return false;
  {
    // Another read of `c` is in progress, maybe on this very thread (a handler of a frame it
    // read that waits): the caller waits another way.
    std::unique_lock<std::mutex> reading(c->read_mutex, std::try_to_lock);
    if (!reading) {
      release_reading(c);
      return false;
    }
    read_while(c, done, until);
  }
  release_reading(c);
  return true;
}

void direct_channel::poke_reader(channel_conn& c) {
  if (c.caller_reading.load(std::memory_order_acquire) && c.reader_thread.load(std::memory_order_relaxed) != std::this_thread::get_id()) {
    const std::uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(c.reader_wake, &one, sizeof one);
  }
}

// The reading role's loop (Note [direct channel], "the caller reads its own response"); the caller
// holds caller_reading and read_mutex.
void direct_channel::read_while(const std::shared_ptr<channel_conn>& c, const std::function<bool()>& done, clock::time_point until) {
  c->reader_thread.store(std::this_thread::get_id(), std::memory_order_relaxed);
  bool block = true;  // Note [blocking first read]: recv alone until a slice passes without data
  while (!done() && !c->closed() && !stopping_) {
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
  c->reader_thread.store(std::thread::id{}, std::memory_order_relaxed);
}

// Calls still pending on `c` are waited on by threads blocked on their call (or by nobody): the
// I/O thread reads for them from now on.
void direct_channel::release_reading(const std::shared_ptr<channel_conn>& c) {
  c->caller_reading.store(false, std::memory_order_release);
  const bool left = client_.table().hand_over(*c);
  if (left || c->actor_traffic.load(std::memory_order_acquire)) wake();
}

// The I/O thread, at most every max_poll_ms, reads the responses of calls whose caller has not
// waited yet (it is busy, or dropped the future). They complete within that bound rather than at
// their deadline. (is_ready() marks its call unattended at once: call_state::ready().)
void direct_channel::read_unwaited(const std::vector<std::shared_ptr<channel_conn>>& outgoing) {
  const auto now = clock::now();
  if (now - last_unwaited_read_ < std::chrono::milliseconds(max_poll_ms)) return;
  last_unwaited_read_ = now;
  for (const auto& c : outgoing)
    if (client_.table().has_calls(*c)) read_for_io(c);
}

void direct_channel::notify_lost(const std::shared_ptr<channel_conn>& c, const std::string& why) {
  if (!stopping_) actors_.lost(c, why);
}

}  // namespace troupe::detail
