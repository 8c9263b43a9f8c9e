#include "executor.hpp"

#include <algorithm>
#include <utility>

namespace troupe::detail {

namespace {
// The executor whose leader this thread is while it runs quick jobs nobody was woken for.
thread_local executor* tls_quick_leader = nullptr;
}  // namespace

void long_work_ahead() {
  if (auto* ex = std::exchange(tls_quick_leader, nullptr)) ex->cv_.notify_one();  // a follower takes the lead
}

executor::executor(int threads) {
  for (int i = 0; i < (threads < 1 ? 1 : threads); ++i) threads_.emplace_back([this] { run(); });
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
}

// Leads once: waits on the source without the lock, runs the quick jobs and the first ordinary
// job it got and queues the rest for the others. Returns with the lock held again.
void executor::lead_once(std::unique_lock<std::mutex>& lock) {
  leading_ = true;
  io_source* src = source_;
  lock.unlock();
  led_jobs got;
  src->lead(got);
  lock.lock();
  leading_ = false;
  for (std::size_t i = 1; i < got.jobs.size(); ++i) jobs_.push_back(std::move(got.jobs[i]));
  lock.unlock();
  led_cv_.notify_all();  // set_source may wait for the lead to be free
  // One follower takes the lead, one more per queued job; nobody when this thread only runs quick
  // jobs and leads again (an empty read wakes one, as before, so a posted job is not missed).
  const std::size_t wake = got.jobs.empty() ? (got.quick.empty() ? 1 : 0) : got.jobs.size();
  for (std::size_t i = 0; i < wake; ++i) cv_.notify_one();
  if (wake == 0) tls_quick_leader = this;  // long_work_ahead() may still wake one
  for (auto& job : got.quick) job();
  tls_quick_leader = nullptr;
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
