#include "executor.hpp"

#include <algorithm>
#include <utility>

namespace troupe::detail {

void executor::long_work_ahead() const {
  const auto me = std::this_thread::get_id();
  if (quick_leader_.load(std::memory_order_relaxed) != me) return;
  quick_leader_.store(std::thread::id(), std::memory_order_relaxed);  // only the leader itself writes it
  hand_off_quick_phase();  // a follower takes the lead
}

executor::executor(int threads, std::chrono::microseconds watchdog_tick) : watchdog_tick_(watchdog_tick) {
  for (int i = 0; i < (threads < 1 ? 1 : threads); ++i) threads_.emplace_back([this] { run(); });
  watchdog_ = std::thread([this] { watch(); });
}

void executor::hand_off_quick_phase() const {
  if (!phase_handed_.exchange(true)) cv_.notify_one();
}

void executor::begin_quick_phase() {
  phase_handed_.store(false, std::memory_order_relaxed);
  quick_phase_.fetch_add(1);  // odd: running (seq_cst, against the watchdog's park below)
  if (watchdog_parked_.load()) {
    std::lock_guard<std::mutex> lock(watchdog_mutex_);
    watchdog_parked_.store(false);
    watchdog_cv_.notify_one();
  }
}

// Note [predicted quick]: a quick phase seen at two ticks in a row has run at least one tick.
void executor::watch() {
  std::uint64_t seen = quick_phase_.load();
  int idle_ticks = 0;
  std::unique_lock<std::mutex> lock(watchdog_mutex_);
  while (!watchdog_stop_) {
    if (idle_ticks >= watchdog_park_ticks) {
      watchdog_parked_.store(true);
      if (quick_phase_.load() == seen)  // else a phase began meanwhile: its leader may not have seen the flag
        watchdog_cv_.wait(lock, [this] { return watchdog_stop_ || !watchdog_parked_.load(); });
      watchdog_parked_.store(false);
      idle_ticks = 0;
      seen = quick_phase_.load();
      continue;
    }
    watchdog_cv_.wait_for(lock, watchdog_tick_, [this] { return watchdog_stop_; });
    const std::uint64_t now = quick_phase_.load();
    if (now == seen && (now & 1) != 0) hand_off_quick_phase();
    idle_ticks = now == seen && (now & 1) == 0 ? idle_ticks + 1 : 0;
    seen = now;
  }
}

executor::~executor() { stop(); }

bool executor::post(std::function<void()> job) {
  io_source* leader = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return false;
    jobs_.push_back(std::move(job));
    if (idle_ == 0 && leading_) leader = source_;  // nobody waits on the cv: the leader must see the job
  }
  cv_.notify_one();
  if (leader) leader->interrupt();
  return true;
}

void executor::set_source(io_source* source) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Swap first: a leader that returns must not find the old source and lead on it again.
  io_source* old = std::exchange(source_, source);
  if (old && leading_) old->interrupt();
  led_cv_.wait(lock, [this] { return !leading_; });
  lock.unlock();
  cv_.notify_all();
}

void executor::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    if (leading_ && source_) source_->interrupt();
  }
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
  threads_.clear();
  {
    std::lock_guard<std::mutex> lock(watchdog_mutex_);
    watchdog_stop_ = true;
  }
  watchdog_cv_.notify_all();
  if (watchdog_.joinable() && watchdog_.get_id() != std::this_thread::get_id()) watchdog_.join();
}

// Leads once: waits on the source without the lock, and runs the quick jobs and the first
// ordinary job it got. It queues the rest for the others. Returns with the lock held again.
void executor::lead_once(std::unique_lock<std::mutex>& lock) {
  leading_ = true;
  io_source* src = source_;
  lock.unlock();
  led_jobs got;
  src->lead(got);
  lock.lock();
  leading_ = false;
  for (std::size_t i = 1; i < got.jobs.size(); ++i) jobs_.push_back(std::move(got.jobs[i]));
  const bool posted = got.jobs.empty() && !jobs_.empty();  // a job posted while this thread led
  lock.unlock();
  led_cv_.notify_all();  // set_source may wait for the lead to be free
  // One follower takes the lead, one more per queued job. Nobody when this thread leads again
  // next: it read only quick jobs, or nothing (an actor frame, an interrupt) while no job waits.
  // A read of nothing with a posted job waiting wakes one to lead: this thread runs that job.
  const std::size_t wake = got.jobs.empty() ? (posted && got.quick.empty() ? 1 : 0) : got.jobs.size();
  for (std::size_t i = 0; i < wake; ++i) cv_.notify_one();
  const bool quick_phase = wake == 0 && !got.quick.empty();
  if (quick_phase) {  // long_work_ahead() or the watchdog may still wake one (Note [predicted quick])
    quick_leader_.store(std::this_thread::get_id(), std::memory_order_relaxed);
    begin_quick_phase();
  }
  for (auto& job : got.quick) job();
  if (quick_phase) quick_phase_.fetch_add(1, std::memory_order_release);  // even: over
  quick_leader_.store(std::thread::id(), std::memory_order_relaxed);
  if (!got.jobs.empty()) got.jobs.front()();
  lock.lock();
}

void executor::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    ++idle_;
    cv_.wait(lock, [this] { return stopping_ || !jobs_.empty() || (source_ && !leading_); });
    --idle_;
    if (!jobs_.empty()) {
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();  // jobs catch their own exceptions (see rpc/serve.cpp)
      lock.lock();
    } else if (stopping_) {
      return;
    } else {
      lead_once(lock);
    }
  }
}

}  // namespace troupe::detail
