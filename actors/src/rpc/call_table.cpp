// The pending-call table of the direct channel (rpc/call_table.hpp).
#include "rpc/call_table.hpp"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "rpc/bulk.hpp"
#include "rpc/byte_pool.hpp"
#include "rpc/channel_conn.hpp"

namespace troupe::detail {

std::uint64_t call_table::add(const std::shared_ptr<channel_conn>& c, const std::shared_ptr<rpc::detail::call_state>& st,
                              const std::string& function) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return 0;
  const auto id = next_id_++;
  const auto dl = deadlines_.emplace(st->deadline(), id);
  st->set_helper(c->waiter, id);  // a waiter reads the response itself; a continuation or poll unattends it
  calls_.emplace(id, entry{st, c.get(), function, dl, false});
  ++c->pending_calls;
  return id;
}

void call_table::finish(const channel_conn* c, std::uint64_t id, errc code, std::string msg, std::vector<char> payload, std::vector<char> meta) {
  std::shared_ptr<rpc::detail::call_state> st;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = calls_.find(id);
    if (it == calls_.end() || it->second.conn != c) return;
    st = std::move(it->second.state);
    deadlines_.erase(it->second.deadline);
    --c->pending_calls;
    if (it->second.unattended) --c->unattended;
    calls_.erase(it);
  }
  if (payload.capacity() >= byte_pool_min_bytes && bulk_)  // Note [byte pool]: back when the call's state dies
    st->set_recycler([bulk = std::weak_ptr<bulk_names>(bulk_)](std::vector<char>&& v) {
      if (auto b = bulk.lock()) b->buffers().give(std::move(v));
    });
  st->complete(code, std::move(msg), std::move(payload), std::move(meta));
  if (c->caller_reading.load(std::memory_order_acquire) &&
      c->reader_thread.load(std::memory_order_relaxed) != std::this_thread::get_id()) {  // it may wait for this very call
    const std::uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(c->reader_wake, &one, sizeof one);
  }
}

void call_table::fail_on(const channel_conn* c, const std::string& peer, const std::string& why, const std::string& me) {
  std::vector<std::pair<std::uint64_t, std::string>> lost;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [id, e] : calls_)
      if (e.conn == c) lost.emplace_back(id, e.function);
  }
  for (auto& [id, fn] : lost)
    finish(c, id, errc::peer_lost, "worker " + peer + " was lost (" + why + ") during call to '" + fn + "' from " + me, {}, {});
}

void call_table::expired(clock::time_point now, std::vector<expired_call>& out) {
  out.clear();
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = deadlines_.begin(); it != deadlines_.end() && it->first <= now; ++it) {
    const auto& e = calls_.at(it->second);
    out.push_back(expired_call{e.conn, it->second, e.state->what()});
  }
}

call_table::clock::time_point call_table::next_deadline(clock::time_point bound) {
  std::lock_guard<std::mutex> lock(mutex_);
  return deadlines_.empty() ? bound : std::min(bound, deadlines_.begin()->first);
}

bool call_table::unattend(const channel_conn* c, std::uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = calls_.find(id);
  if (it == calls_.end() || it->second.conn != c || it->second.unattended) return false;
  it->second.unattended = true;
  return ++c->unattended == 1;
}

bool call_table::needs_io(const channel_conn& c) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (c.pending_calls == 0) c.handed_over = false;
  return c.unattended > 0 || c.handed_over;
}

bool call_table::hand_over(const channel_conn& c) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (c.pending_calls == 0) return false;
  c.handed_over = true;
  return true;
}

bool call_table::has_calls(const channel_conn& c) {
  std::lock_guard<std::mutex> lock(mutex_);
  return c.pending_calls > 0;
}

call_table::left_calls call_table::close() {
  std::unordered_map<std::uint64_t, entry> left;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    left.swap(calls_);
    deadlines_.clear();
  }
  left_calls states;
  states.reserve(left.size());
  for (auto& [id, e] : left) states.push_back(std::move(e.state));
  return states;
}

}  // namespace troupe::detail
