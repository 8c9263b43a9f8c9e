// The handle of one asynchronous collective (process_group.hpp).
#include "work_state.hpp"

namespace troupe::ddp {

namespace {
/// Remembers when a device work was first seen finished (for completed_at).
void note_device_done(work::state& s) {
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.done) {
    s.done = true;
    s.finished_at = std::chrono::steady_clock::now();
  }
}
}  // namespace

void work::wait(std::chrono::milliseconds timeout) const {
  if (!state_) throw troupe::error(errc::invalid_state, "work::wait on an empty work handle");
  if (state_->device) {
    try {
      state_->device->wait(timeout);
    } catch (...) {
      if (state_->device->poll()) note_device_done(*state_);
      throw;
    }
    note_device_done(*state_);
    return;
  }
  std::unique_lock<std::mutex> lock(state_->mu);
  if (!state_->cv.wait_for(lock, timeout, [&] { return state_->done; }))
    throw troupe::error(errc::timeout, state_->description + " did not complete within " +
                                           std::to_string(timeout.count()) + " ms");
  if (state_->err) throw *state_->err;
}

bool work::is_completed() const {
  if (!state_) return false;
  if (state_->device) {
    if (!state_->device->poll()) return false;
    note_device_done(*state_);
    return true;
  }
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

std::optional<troupe::error> work::error() const {
  if (!state_) return std::nullopt;
  if (state_->device) return state_->device->error();
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->err;
}

std::optional<std::chrono::steady_clock::time_point> work::completed_at() const {
  if (!state_) return std::nullopt;
  if (state_->device) static_cast<void>(is_completed());
  std::lock_guard<std::mutex> lock(state_->mu);
  if (!state_->done) return std::nullopt;
  return state_->finished_at;
}

void work::synchronize_stream() const {
  if (!state_) throw troupe::error(errc::invalid_state, "work::synchronize_stream on an empty work handle");
  if (state_->device) state_->device->synchronize_stream();
  else wait();
}

std::string work::description() const { return state_ ? state_->description : std::string("(empty work)"); }

}  // namespace troupe::ddp
