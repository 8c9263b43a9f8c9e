#pragma once
// Hang blame of one process group. It records each collective in the flight recorder and
// publishes where this rank is. When a collective waits too long or fails, it tells who is where.
//
// Note [hang blame]
// Every rank numbers its group collectives alike (the sequence number of Note [shm collectives]),
// so the highest number each rank entered shows who is missing. Each rank publishes its last
// entered collective under "troupe/pg/<group>/at/<rank>" as "<seq>\t<op>\t<note>":
//   - once at construction ("0": none entered yet);
//   - from a watch thread, never from the collective path. It writes when its current collective
//     has run blame_after / 2. Otherwise it writes at most every blame_after / 2 while the number
//     changed.
// When the current collective has run blame_after, the watch thread reads every rank's position
// and hands the report to on_blame (stderr by default):
//
//   rank 0: allreduce #2 runs 1 s --read at/0..at/2--> "rank 2 never entered allreduce #2
//           (bucket 0); its last was #1 (allreduce); ranks 0-1 waited 1.0 s"
//
// When the collective fails, this rank publishes its position, its error message gets a report
// made then, and the recorder writes its trace (node_options::trace_dir).
// Guarantees: a rank that waits at least blame_after has published its position. So a report
// made by another waiting rank counts it in. A rank that never entered shows its position of at
// most blame_after / 2 plus one tick earlier. Failure: a rank whose position cannot be read in
// time is reported as not answering. Costs on the collective path: a mutex and a recorder entry.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "troupe/actors/flight_recorder.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::ddp::detail {

/// The group's store, as the watch uses it (both may throw troupe::error).
struct watch_store {
  std::function<void(const std::string& key, const std::string& value)> set;
  std::function<std::string(const std::string& key, std::chrono::milliseconds timeout)> get;
};

/// One group's watch (see the note). Thread-safe.
class collective_watch {
 public:
  /// Publishes "none entered" for `rank` and starts the watch thread. `blame_after` of zero
  /// turns the thread off (failures are still explained). Throws what store.set throws.
  collective_watch(watch_store store, std::string group, int rank, int world, std::shared_ptr<flight_recorder> recorder,
                   std::chrono::milliseconds blame_after, std::function<void(const std::string&)> on_blame);
  /// Stops the watch thread (bounded by one round of store reads). Never throws.
  ~collective_watch();
  collective_watch(const collective_watch&) = delete;
  collective_watch& operator=(const collective_watch&) = delete;

  /// The collective `op` #`seq` runs on this thread while the returned guard lives. `note`
  /// names it for reports (e.g. "bucket 2"); `detail` is its recorder detail when no note.
  class running {
   public:
    running(collective_watch& w, std::uint64_t token) : w_(&w), token_(token) {}
    ~running() { w_->leave(token_, ok_); }
    running(const running&) = delete;
    running& operator=(const running&) = delete;
    void fail() noexcept { ok_ = false; }

   private:
    collective_watch* w_;
    std::uint64_t token_;
    bool ok_ = true;
  };
  [[nodiscard]] running enter(const std::string& op, std::uint32_t seq, const std::string& note, const std::string& detail);

  /// Runs `fn` (collective `op` #`seq`) between enter() and the guard's end. A troupe::error it
  /// throws, other than collective_mismatch (which every rank sees alike), is rethrown explained.
  template <class Fn>
  void run(const std::string& op, std::uint32_t seq, const std::string& note, const std::string& detail, Fn&& fn) {
    auto guard = enter(op, seq, note, detail);
    try {
      fn();
    } catch (const troupe::error& e) {
      guard.fail();
      if (e.code() == errc::collective_mismatch) throw;
      throw explain(e);
    }
  }

  /// `e` with who is where for the running collective appended; writes the recorder's trace.
  /// Called on the collective's thread while its guard lives. Never throws.
  troupe::error explain(const troupe::error& e);

 private:
  struct position {
    std::uint32_t seq = 0;
    std::string op, note;
  };
  void leave(std::uint64_t token, bool ok) noexcept;
  void loop();
  void watch_once(std::chrono::steady_clock::time_point now);
  void publish(const position& p);
  std::string report(const position& p, std::chrono::milliseconds waited);
  rank_position read_position(int r, std::chrono::steady_clock::time_point until);

  watch_store store_;
  std::string group_;
  int rank_, world_;
  std::shared_ptr<flight_recorder> recorder_;
  std::chrono::milliseconds blame_after_;
  std::function<void(const std::string&)> on_blame_;

  std::mutex mu_;  // guards the fields below
  std::condition_variable cv_;
  bool stopping_ = false;
  position entered_;  // the last collective this rank entered
  bool running_ = false;
  std::chrono::steady_clock::time_point since_;
  std::uint32_t published_ = 0;
  std::chrono::steady_clock::time_point published_at_;
  std::uint32_t blamed_ = 0;  // the last collective reported

  std::mutex report_mu_;  // one report at a time (the watch thread and a failing collective)
  std::thread thread_;
};

}  // namespace troupe::ddp::detail
