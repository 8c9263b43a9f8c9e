// The handle of one asynchronous collective (process_group.hpp).
#include "work_state.hpp"

namespace troupe::ddp {

void work::wait(std::chrono::milliseconds timeout) const {
  if (!state_) throw troupe::error(errc::invalid_state, "work::wait on an empty work handle");
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_for(lock, timeout, [&] { return state_->done; }))
    throw troupe::error(errc::timeout, state_->description + " did not complete within " +
                                           std::to_string(timeout.count()) + " ms");
  if (state_->err) throw *state_->err;
}

bool work::is_completed() const {
  if (!state_) return false;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

std::optional<troupe::error> work::error() const {
  if (!state_) return std::nullopt;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->err;
}

std::optional<std::chrono::steady_clock::time_point> work::completed_at() const {
  if (!state_) return std::nullopt;
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->done) return std::nullopt;
  return state_->finished_at;
}

std::string work::description() const { return state_ ? state_->description : std::string("(empty work)"); }

}  // namespace troupe::ddp
