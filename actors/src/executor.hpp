#pragma once
// The executor: a fixed pool of threads running user RPC functions and future continuations.
// They never run on CAF scheduler threads (DESIGN.md: user code never blocks inside an actor).
//
// Leader/follower (Note [direct channel]): with an io_source attached, an idle thread becomes
// the leader. It waits for input on the source itself (the direct rpc sockets). It runs the first
// job it reads at once and queues the rest; another idle thread takes over as leader. A request
// thus costs no hand-off from an I/O thread to a worker. At most one thread leads at a time.
//
// Quick jobs (rpc::function_options::quick: never block, microseconds) are run by the leader
// itself, in order, before the first ordinary job. They wake no thread. A read of quick jobs
// only wakes nobody: the leader leads again right after. So does a read that made no job,
// unless a posted job waits; then one follower leads while the leader runs that job. (Remote
// actor frames go to their actors on the reading thread, so they make no job.) A read with
// ordinary jobs wakes one follower to lead, plus one per ordinary job after the first.
// A quick job may turn out long: an RRef fetch answering with a large tensor, which the codec
// copies. It calls long_work_ahead() on the executor first; the codec finds the executor in its
// codec context (codec_context::work). That wakes a follower to take the lead, so the sockets
// are not left unread meanwhile (rref_bench figures in docs/rref.md). The executor knows its
// quick leader by thread id: a notice from any other thread, or to another executor, does
// nothing.
//
// Note [predicted quick]
//
// An ordinary function whose last 16 runs each took under 50 us (rpc/call_server.cpp) runs the
// same way, as a quick job. The bound: the quick jobs of one read are expected to take under
// 50 us together. So requests of tens of microseconds that arrive together still run in
// parallel on followers. Why: a follower's wake-up is most of what a small round trip costs
// beyond raw TCP on a busy machine. A futex wake of a thread on another vCPU costs the waker a
// VM exit. A prediction can fail (the function blocks this time), so a quick phase is watched:
//   * our own blocking waits (an RPC future's wait/get, rpc_sync, a store request) call
//     long_work_ahead() on their node's executor first. The call state and the store client
//     hold it. So a nested call hands the lead off at once, before it blocks;
//   * the executor's watchdog thread ticks every watchdog tick (1 ms) while quick phases happen.
//     When it finds the same quick phase running at two ticks in a row, it wakes a follower to
//     lead. So a user function that blocks on its own lock or sleeps never deadlocks the node.
//     It delays the requests read after it by at most two ticks. The watchdog parks after
//     watchdog_park_ticks ticks without a quick phase (an idle node wakes nobody). The next
//     quick phase unparks it.
// A quick phase costs the leader two atomic increments and a load; it wakes nobody.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "troupe/actors/rpc/codec_context.hpp"

namespace troupe::detail {

/// What one lead() made of its input (see the file comment).
struct led_jobs {
  std::vector<std::function<void()>> quick;  ///< run by the leader first, in order
  std::vector<std::function<void()>> jobs;   ///< the leader runs the first, followers the rest
  std::uint64_t predicted_ns = 0;            ///< the source's own count: how long it expects `quick` to take
};

/// Input the executor's leader waits on (see the file comment).
class io_source {
 public:
  virtual ~io_source() = default;
  /// Blocks until input arrives or interrupt() is called; appends the jobs it made. Runs on the
  /// leading executor thread, one call at a time.
  virtual void lead(led_jobs& got) = 0;
  /// Makes a running lead() return soon. Any thread.
  virtual void interrupt() = 0;
};

class executor final : public rpc::long_work_notice {
 public:
  /// Note [predicted quick]: the watchdog's default period, and how many idle ticks before it parks.
  static constexpr std::chrono::microseconds default_watchdog_tick{1000};
  static constexpr int watchdog_park_ticks = 50;

  /// `watchdog_tick`: Note [predicted quick] (tests lengthen it to tell the watchdog's hand-off
  /// from long_work_ahead's).
  explicit executor(int threads, std::chrono::microseconds watchdog_tick = default_watchdog_tick);
  ~executor();
  executor(const executor&) = delete;
  executor& operator=(const executor&) = delete;

  /// Queues a job; returns false (and drops it) after stop().
  bool post(std::function<void()> job);
  /// Lets queued jobs finish, then joins the threads. Idempotent. Must not be called from a pool
  /// thread.
  void stop();
  /// Attaches `source` (null detaches). Detaching waits until no thread is inside lead().
  void set_source(io_source* source);
  /// Called before long work (a copy of a large tensor, a blocking wait) on any thread. This
  /// thread may be this executor's leader running quick jobs, with no follower woken for them.
  /// Then it wakes one now to take the lead. Otherwise does nothing. Cheap (one atomic load).
  void long_work_ahead() const override;

 private:
  void run();
  void lead_once(std::unique_lock<std::mutex>& lock);
  void watch();               // the watchdog thread (Note [predicted quick])
  void begin_quick_phase();
  void hand_off_quick_phase() const;  // a follower takes the lead (once per phase)
  std::mutex mutex_;
  mutable std::condition_variable cv_;
  std::condition_variable led_cv_;  // leading_ became false (for set_source)
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  io_source* source_ = nullptr;
  bool leading_ = false;
  int idle_ = 0;  // threads waiting on cv_
  std::vector<std::thread> threads_;

  // Note [predicted quick]. quick_phase_ is odd while the leader runs quick jobs nobody was woken
  // for; phase_handed_ says a follower was woken for the current phase already.
  std::atomic<std::uint64_t> quick_phase_{0};
  mutable std::atomic<bool> phase_handed_{false};
  // The thread leading the current quick phase nobody was woken for (none: no such phase, or
  // its lead was handed off already by long_work_ahead).
  mutable std::atomic<std::thread::id> quick_leader_{};
  std::atomic<bool> watchdog_parked_{false};
  std::mutex watchdog_mutex_;
  std::condition_variable watchdog_cv_;
  bool watchdog_stop_ = false;  // under watchdog_mutex_
  std::chrono::microseconds watchdog_tick_;
  std::thread watchdog_;
};

}  // namespace troupe::detail
