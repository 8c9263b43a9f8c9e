#pragma once
// Note [rpc blame]
//
// Hang blame for slow calls. A node with blame_after > 0 runs this watch. Every tick
// (blame_after / 4, within 10..250 ms) it reads its flight recorder. Each RPC it made that has
// run blame_after or longer, and that it has not blamed yet, gets one report. The report names
// the caller, the callee, the function, the call's number in the caller's recorder and how long
// it has waited. Then the watch asks the callee where it is, through the reserved quick function
// troupe.blame.where. The question is bounded by ask_bound (2 s). The watch does not wait for
// the answer, and the caller waits for none of this. The callee answers from its recorder:
//   * running the function for this caller (since when);
//   * or not: its last such run ended when, or it has no record (never received, or still
//     queued there);
//   * and what else it runs.
// A callee that is gone makes the report say "is lost", one that does not answer in time "did
// not answer". The report with the answer goes to node_options::on_blame (stderr by default)
// and to the node's blame_board. So a call that then times out carries it in its error.
//
//   watch --tick--> recorder: rpc_call open >= blame_after --> board[seq] = caller part
//         --troupe.blame.where(caller, fn)--> callee recorder --answer--> board[seq], on_blame
//
// Limits: a call whose deadline comes before blame_after is never blamed. A callee with every
// executor thread blocked answers late or not at all (the report says so). The recorder keeps
// the last recorder_capacity operations, so a call older than those is not seen.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "rpc/blame_board.hpp"
#include "troupe/actors/flight_recorder.hpp"
#include "troupe/actors/rpc/future.hpp"

namespace troupe::detail {

/// The reserved function a callee answers blame questions with.
inline constexpr const char* blame_function = "troupe.blame.where";
/// How long the watch waits for a callee's answer.
inline constexpr std::chrono::milliseconds ask_bound{2000};

/// The callee's side: what `rec` says about calls of `function` from `caller` (one sentence
/// starting with `me`).
std::string where_is(const flight_recorder& rec, const std::string& me, const std::string& caller, const std::string& function);

/// Watches the calls of one node (Note [rpc blame]); the thread stops and is joined on destruction.
class rpc_watch {
 public:
  /// Starts a question to `callee` about `function`, bounded by `timeout`.
  using ask_fn = std::function<std::shared_ptr<rpc::detail::call_state>(const std::string& callee, const std::string& function,
                                                                        std::chrono::milliseconds timeout)>;
  using report_fn = std::function<void(const std::string&)>;

  /// `on_blame` null: reports go to stderr.
  rpc_watch(std::string me, std::shared_ptr<flight_recorder> rec, std::shared_ptr<rpc::detail::blame_board> board,
            std::chrono::milliseconds blame_after, ask_fn ask, report_fn on_blame);
  ~rpc_watch();
  rpc_watch(const rpc_watch&) = delete;
  rpc_watch& operator=(const rpc_watch&) = delete;

 private:
  void run();
  void check();
  void blame(const trace_entry& e, std::chrono::steady_clock::duration waited);

  // Where reports go: the board and on_blame, until the watch is destroyed. Answers that come
  // later are dropped, so on_blame is never called after the node's teardown.
  struct outlet {
    std::mutex mu;
    bool closed = false;
    std::shared_ptr<rpc::detail::blame_board> board;
    report_fn on_blame;
    void report(std::uint64_t seq, const std::string& text);
    void close();
  };

  std::string me_;
  std::shared_ptr<flight_recorder> rec_;
  std::shared_ptr<rpc::detail::blame_board> board_;
  std::chrono::milliseconds blame_after_;
  ask_fn ask_;
  std::shared_ptr<outlet> outlet_;
  std::set<std::uint64_t> blamed_;  // recorder numbers of the calls reported
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace troupe::detail
