#include "troupe/actors/rpc/future.hpp"

#include <optional>

#include "blame_board.hpp"
#include "intercept.hpp"

namespace troupe::rpc::detail {

namespace {
// Grace beyond the deadline. The agent's deadline sweep runs every few milliseconds, so a call
// is completed well within it. The grace only guards against a wedged agent.
constexpr auto deadline_grace = std::chrono::seconds(2);
}  // namespace

call_state::~call_state() {
  if (recycle_ && !payload_.empty()) recycle_(std::move(payload_));  // a shared payload: by its deleter
}

void call_state::set_recycler(std::function<void(std::vector<char>&&)> recycle) {
  std::lock_guard<std::mutex> lock(mutex_);
  recycle_ = std::move(recycle);
}

void call_state::hold_until_complete(std::vector<std::shared_ptr<const void>> held) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!done_) held_ = std::move(held);
}

bool call_state::complete(errc code, std::string message, std::vector<char> payload, std::vector<char> meta) {
  std::vector<std::function<void()>> conts, inline_conts;
  std::vector<std::shared_ptr<const void>> released;  // the IPC sources go once the call is over
  if (code == errc::timeout && !done()) message = with_blame(std::move(message));  // Note [rpc blame]
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return false;
    done_ = true;
    released.swap(held_);
    code_ = code;
    message_ = std::move(message);
    if (payload.size() >= adopt_min_bytes) {  // Note [adopted payload]: recycled when the last viewer is gone
      shared_payload_ = std::shared_ptr<std::vector<char>>(new std::vector<char>(std::move(payload)), [recycle = recycle_](std::vector<char>* v) {
        if (recycle && !v->empty()) recycle(std::move(*v));
        delete v;
      });
    } else {
      payload_ = std::move(payload);
    }
    meta_ = std::move(meta);
    conts.swap(continuations_);
    inline_conts.swap(inline_continuations_);
    completed_.store(true, std::memory_order_release);  // last: done() then sees the whole answer
  }
  cv_.notify_all();
  if (recorder_) recorder_->end(trace_token_, code == errc::ok);
  for (auto& c : inline_conts) c();
  for (auto& c : conts)
    if (!post_ || !(*post_)(c)) c();  // executor gone (shutdown): run here rather than lose it
  return true;
}

std::shared_ptr<call_state> call_state::derive(const std::string& step, clock::time_point deadline) const {
  return std::make_shared<call_state>(function_ + " (" + step + ")", to_, from_, deadline, post_, work_);
}

bool call_state::complete_value(std::shared_ptr<void> value) {
  {
    std::lock_guard<std::mutex> lock(decode_mutex_);
    if (done()) return false;
    decoded_ = true;
    decoded_value_ = std::move(value);
    intercepted_ = true;  // get() takes the decoded value (decode_once)
  }
  return complete(errc::ok, {}, {});
}

bool call_state::wait_for(std::chrono::milliseconds timeout) const {
  const auto end = clock::now() + timeout;
  if (!done()) {
    if (work_) work_->long_work_ahead();  // Note [predicted quick]: a leader about to block hands the lead off
    help_wait(end);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_until(lock, end, [this] { return done_; });
}

bool call_state::done() const { return completed_.load(std::memory_order_acquire); }

bool call_state::ready() const {
  if (done()) return true;
  if (helper_) helper_->unattended(helper_id_);  // someone polls without waiting: the I/O thread reads for it
  return done();
}

const std::vector<char>& call_state::value() const {
  if (!done()) {
    if (work_) work_->long_work_ahead();  // Note [predicted quick]
    help_wait(deadline_ + deadline_grace);
  }
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_until(lock, deadline_ + deadline_grace, [this] { return done_; }))
    throw error(errc::timeout, with_blame(what() + ": no answer by the deadline"));
  if (code_ != errc::ok) throw error(code_, message_);
  return shared_payload_ ? *shared_payload_ : payload_;
}

bool call_state::queue_if_pending(std::vector<std::function<void()>>& list, std::function<void()>& fn) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return false;
    list.push_back(std::move(fn));
  }
  if (helper_) helper_->unattended(helper_id_);  // nobody may wait for it: its response must be read
  return true;
}

void call_state::set_trace(std::shared_ptr<flight_recorder> recorder, std::uint64_t token) {
  recorder_ = std::move(recorder);
  trace_token_ = token;
}

std::string call_state::with_blame(std::string message) const {
  if (!blame_) return message;
  if (auto report = blame_->get(blame_seq_); !report.empty()) message += "; " + report;
  return message;
}

void call_state::set_blame(std::shared_ptr<const blame_board> board, std::uint64_t seq) {
  blame_ = std::move(board);
  blame_seq_ = seq;
}

void call_state::on_complete(std::function<void()> fn) {
  if (queue_if_pending(continuations_, fn)) return;
  if (!post_ || !(*post_)(fn)) fn();
}

void call_state::on_complete_inline(std::function<void()> fn) {
  if (!queue_if_pending(inline_continuations_, fn)) fn();  // already complete: run here
}

void call_state::set_helper(std::shared_ptr<call_helper> helper, std::uint64_t id) {
  helper_ = std::move(helper);
  helper_id_ = id;
}

void call_state::help_wait(clock::time_point until) const {
  if (helper_) helper_->wait(*this, until);
}

void call_state::set_scope(std::shared_ptr<call_scope> scope) {
  scope_ = std::move(scope);
  intercepted_ = scope_ != nullptr;
}

std::shared_ptr<void> call_state::decode_once(const std::function<std::shared_ptr<void>(const std::vector<char>&, call_scope*)>& decode) {
  std::lock_guard<std::mutex> lock(decode_mutex_);
  if (!decoded_) {
    decoded_ = true;
    try {
      std::optional<scope_guard> active;
      guarded("enter", [&] { active.emplace(scope_.get()); });
      guarded("on_meta", [&] { scope_->on_meta(meta_); });
      decoded_value_ = decode(shared_payload_ ? *shared_payload_ : payload_, scope_.get());
    } catch (...) {
      decode_error_ = std::current_exception();
    }
    scope_.reset();  // the exchange is over: the interceptor's state may go
  }
  if (decode_error_) std::rethrow_exception(decode_error_);
  return decoded_value_;
}

}  // namespace troupe::rpc::detail
