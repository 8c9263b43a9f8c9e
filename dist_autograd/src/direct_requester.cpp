// Direct requests to the peers' services (Note [direct requests] in direct_requester.hpp).
#include "direct_requester.hpp"

#include <algorithm>

#include <caf/actor_cast.hpp>
#include <caf/actor_registry.hpp>
#include <caf/actor_clock.hpp>
#include <caf/atom.hpp>
#include <caf/actor_companion.hpp>
#include <caf/mailbox_element.hpp>
#include <caf/make_message.hpp>
#include <caf/message_id.hpp>
#include <caf/sec.hpp>

namespace troupe::dist_autograd {

namespace {
/// The companion's sweep message (Note [direct requests]).
using sweep_atom = caf::atom_constant<caf::atom("dsweep")>;

caf::actor_companion* companion_of(const caf::strong_actor_ptr& p) {
  return static_cast<caf::actor_companion*>(caf::actor_cast<caf::abstract_actor*>(p));
}
}  // namespace

direct_requester::direct_requester(node& n)
    : n_(n),
      sys_(n.system()),
      companion_(caf::actor_cast<caf::strong_actor_ptr>(sys_.spawn<caf::actor_companion, caf::hidden>())) {
  companion_of(companion_)->on_enqueue([this](caf::mailbox_element_ptr e) {
    if (!e) return;
    if (e->mid.is_response()) return on_reply(e->mid.request_id().integer_value(), e->move_content_to_message());
    if (e->content().match_elements<sweep_atom>()) sweep();  // the armed timer; nothing else is expected
  });
}

direct_requester::~direct_requester() {
  companion_of(companion_)->on_enqueue(nullptr);  // waits for a handler in progress; none runs after it
  try {
    sys_.registry().erase(companion_->id());  // the remote layer put it there for its replies
  } catch (...) {  // the system is going: it takes the companion with it
  }
  companion_.reset();  // its last reference: it terminates, its watchers learn it
  std::lock_guard<std::mutex> lock(m_);
  pending_.clear();
}

std::uint64_t direct_requester::request(const caf::actor& dest, caf::message msg, reply_fn fn,
                                         std::chrono::steady_clock::time_point deadline) {
  std::uint64_t key = 0;
  caf::message_id mid;
  {
    std::lock_guard<std::mutex> lock(m_);
    mid = caf::make_message_id(++next_);
    key = mid.request_id().integer_value();
    pending_.emplace(key, entry{std::move(fn), deadline});
  }
  if (deadline != std::chrono::steady_clock::time_point::max()) arm(deadline);
  if (!dest) {
    on_reply(key, caf::make_message(caf::make_error(caf::sec::invalid_argument, "no service handle")));
    return key;
  }
  dest->enqueue(caf::make_mailbox_element(companion_, mid, {}, std::move(msg)), nullptr);
  return key;
}

void direct_requester::cancel(std::uint64_t key) {
  std::lock_guard<std::mutex> lock(m_);
  pending_.erase(key);
}

void direct_requester::on_reply(std::uint64_t key, caf::message&& content) {
  reply_fn fn;
  {
    std::lock_guard<std::mutex> lock(m_);
    auto it = pending_.find(key);
    if (it == pending_.end()) return;  // cancelled, or a duplicate of a reply already handed over
    fn = std::move(it->second.fn);
    pending_.erase(it);
  }
  fn(std::move(content));
}

void direct_requester::arm(std::chrono::steady_clock::time_point at) {
  {
    std::lock_guard<std::mutex> lock(m_);
    if (armed_ <= at) return;
    armed_ = at;
  }
  // Outside m_: the clock's thread takes its own lock, then ours in sweep().
  auto sweep = caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, sweep_atom::value);
  sys_.clock().schedule_message(at, companion_, std::move(sweep));
}

void direct_requester::sweep() {
  const auto now = std::chrono::steady_clock::now();
  auto next = std::chrono::steady_clock::time_point::max();
  std::vector<reply_fn> expired;
  {
    std::lock_guard<std::mutex> lock(m_);
    armed_ = std::chrono::steady_clock::time_point::max();
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->second.deadline <= now) {
        expired.push_back(std::move(it->second.fn));
        it = pending_.erase(it);
        continue;
      }
      next = std::min(next, it->second.deadline);
      ++it;
    }
  }
  if (next != std::chrono::steady_clock::time_point::max()) arm(next);
  for (auto& fn : expired) fn(caf::message{});
}

reply_batch::reply_batch() : st_(std::make_shared<shared>()) {}

std::size_t reply_batch::send(direct_requester& r, const caf::actor& dest, caf::message msg) {
  std::size_t slot = 0;
  {
    std::lock_guard<std::mutex> lock(st_->m);
    slot = st_->replies.size();
    st_->replies.emplace_back();
  }
  dests_.push_back(dest);
  keys_.push_back(r.request(dest, std::move(msg), [st = st_, slot](caf::message&& reply) {
    std::lock_guard<std::mutex> lock(st->m);
    st->replies[slot] = std::move(reply);
    ++st->answered;
    st->cv.notify_all();
    if (st->reader) st->reader->poke();  // nothing when the reading thread delivered it itself
  }));
  return slot;
}

bool reply_batch::all_answered() {
  std::lock_guard<std::mutex> lock(st_->m);
  return st_->answered == st_->replies.size();
}

// Note [caller reads actor replies]: this thread reads the connection of the first peer still
// owing a reply that it can read. The other replies come through their readers and poke it.
void reply_batch::read_replies(direct_requester& r, std::chrono::steady_clock::time_point deadline) {
  for (std::size_t i = 0; i < dests_.size() && std::chrono::steady_clock::now() < deadline; ++i) {
    {
      std::lock_guard<std::mutex> lock(st_->m);
      if (st_->answered == st_->replies.size()) return;
      if (!st_->replies[i].empty()) continue;
    }
    reply_reader reader(r.owner(), dests_[i]);
    {
      std::lock_guard<std::mutex> lock(st_->m);
      st_->reader = &reader;
    }
    const bool read = reader.read_until([this] { return all_answered(); }, deadline);
    {
      std::lock_guard<std::mutex> lock(st_->m);
      st_->reader = nullptr;
    }
    if (read) return;
  }
}

std::vector<caf::message> reply_batch::wait_until(direct_requester& r, std::chrono::steady_clock::time_point deadline) {
  read_replies(r, deadline);
  std::unique_lock<std::mutex> lock(st_->m);
  st_->cv.wait_until(lock, deadline, [&] { return st_->answered == st_->replies.size(); });
  std::vector<caf::message> out = st_->replies;
  lock.unlock();
  for (auto key : keys_) r.cancel(key);
  return out;
}

}  // namespace troupe::dist_autograd
