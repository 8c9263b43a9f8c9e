#include "troupe/actors/rpc/future.hpp"

namespace troupe::rpc::detail {

namespace {
// Grace beyond the deadline: the agent's deadline sweep runs every few milliseconds, so a call
// is completed well within it; the grace only guards against a wedged agent.
constexpr auto deadline_grace = std::chrono::seconds(2);
}  // namespace

bool call_state::complete(errc code, std::string message, std::vector<char> payload) {
  std::vector<std::function<void()>> conts;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return false;
    done_ = true;
    code_ = code;
    message_ = std::move(message);
    payload_ = std::move(payload);
    conts.swap(continuations_);
  }
  cv_.notify_all();
  for (auto& c : conts)
    if (!post_ || !post_(c)) c();  // executor gone (shutdown): run here rather than lose it
  return true;
}

bool call_state::wait_for(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_for(lock, timeout, [this] { return done_; });
}

bool call_state::ready() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

const std::vector<char>& call_state::value() const {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_until(lock, deadline_ + deadline_grace, [this] { return done_; }))
    throw error(errc::timeout, what_ + ": no answer by the deadline");
  if (code_ != errc::ok) throw error(code_, message_);
  return payload_;
}

void call_state::on_complete(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!done_) {
      continuations_.push_back(std::move(fn));
      return;
    }
  }
  if (!post_ || !post_(fn)) fn();
}

}  // namespace troupe::rpc::detail
