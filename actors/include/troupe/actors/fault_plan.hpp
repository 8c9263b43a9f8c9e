#pragma once
/// \file fault_plan.hpp
/// A seeded, replayable fault plan for the transport hook (Note [transport hook]).
///
///   troupe::fault_plan plan = troupe::fault_plan::parse(
///       "seed 7\n"
///       "rule actor:troupe.rref.fork_request fail_first=2 drop=0.1\n"
///       "rule * delay=1..5 reorder=10\n");
///   auto hook = std::make_shared<troupe::fault_injector>(plan);
///   troupe::node n(opts, fns, hook);
///
/// Note [fault plan]
/// A plan is a seed and a list of rules. A rule matches a message by its key. Keys:
///   * the function name of the call: requests and the responses to them;
///   * "rpc_request" / "rpc_response" / "actor_message": every message of that kind;
///   * "actor:TYPES": remote actor messages whose CAF type names, comma-separated, are TYPES,
///     e.g. "actor:my_msg";
///   * a store operation ("troupe.store.get", "troupe.store.set", ...);
///   * "troupe.store:KEY": the store messages of that key;
///   * "troupe.store": all store traffic. A request is faulted as a request, its answer as a
///     response (Note [store faults] in src/store_client.cpp);
///   * "collective[:...]": one rank's collective payloads (Note [collective payload faults] in
///     ddp/src/payload_faults.hpp). Only these keys match them; "*" does not;
///   * "*": everything else.
/// Remote actor messages (requests, responses and one-way sends alike) are faulted as requests.
/// The first matching rule decides. Per rule:
///   fail_first=N   drops the first N requests of the key that leave this injector (PyTorch's
///                  faulty agent fails the first sends of fork request, child accept, user delete)
///   nth=N          drops the N-th request of the key (1-based)
///   drop=p         drops a request with probability p (a lost request: the callee never runs)
///   drop_reply=p   drops a response with probability p (a lost reply: the callee ran)
///   duplicate=p    delivers two copies with probability p
///   delay=a..b     delays every message by a uniform time in [a, b] ms
///   reorder=w      delays every message by a uniform time in [0, w] ms, so later messages
///                  overtake earlier ones within a window of w ms
/// Counts are at most 2^31 - 1 (fail_first) and times at most fault_rule::max_delay_ms (an hour);
/// anything else is refused like any malformed field.
/// Note [fault events]
/// Beside rules, a plan holds events:
///   partition A B [for=MS] [hold]   cuts workers A and B apart in both directions (A and B are
///                  comma-separated worker names) from the injector's start for MS ms (0 or no
///                  `for`: until heal()). Without `hold` the traffic between them is dropped;
///                  with `hold` it is delayed until the cut ends (arrives after the heal).
///   kill POINT step=N [worker=W]    SIGKILLs the process of worker W (any worker when absent)
///                  when it reaches fault_point(POINT, N).
///   pause POINT step=N for=MS [worker=W]  stops that process (SIGSTOP) for MS ms at that point;
///                  a forked helper sends SIGCONT and the process reaps it on resuming.
///   drop_heartbeats A B [for=MS]   the workers of list B hear nothing from those of list A,
///                  heartbeats included, from the injector's start for MS ms (0 or no `for`:
///                  until heal()); messages are not dropped by it.
///   delay POINT step=N for=MS [worker=W]  blocks the thread that reaches that point for MS ms
///                  (the rest of the process runs on): a late collective contribution, a slow
///                  step.
/// A partition applies to the messages that pass the hook (RPC, actor and store messages).
/// A dropping cut, or dropped heartbeats, may last the peer timeout (connection_timeout). Then
/// each side that hears nothing declares the other lost (Note [silent peers]). Its pending calls
/// fail with peer_lost naming it. A held cut never does.
/// Points are reported by fault_point(); a node whose hook has no event there does nothing. The
/// library reports its own: DDP "forward", "backward", "allreduce", "allreduce_done" (through its
/// group), the checkpointer's "checkpoint" and distributed autograd's "backward" (docs/faults.md).
///
/// Note [fault schedule]
///
/// An injector with a log sink writes one line per fault it applies, when it applies it:
/// `troupe-fault: drop|duplicate|delay|cut|hold|kill|pause|resumed|heal ...`. A first line gives
/// the plan's seed and a last line its counters. Same seed and same message sequence per key:
/// the same lines.
/// Decisions are taken on send only (on_receive passes everything), so one injector shared by
/// every node of a test process faults each message once.
///
/// Replay: every decision is a counter-based random number of (seed, key, n, decision). Here n
/// is the sequence number of the message among those of its key seen by this injector. The same
/// seed and the same per-key message sequence give the same faults; no state but counters.
///
/// Responses carry no function name. The injector remembers (peer, call id) -> function when it
/// sees the request, on send of the caller or on receive of the callee. It forgets it when the
/// response passes.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/transport.hpp"

namespace troupe {

class node;

/// The faults applied to messages of one key (Note [fault plan]).
struct fault_rule {
  /// The largest delay, lower or upper bound, or reorder window a plan may set (one hour).
  static constexpr long max_delay_ms = 3'600'000;
  std::string match = "*";  ///< function name, "rpc_request", "rpc_response", "actor_message", "actor:TYPES" or "*"
  int fail_first = 0;       ///< drop the first N requests
  int nth = 0;              ///< drop the N-th request (1-based; 0: none)
  double drop = 0.0;        ///< probability of dropping a request
  double drop_reply = 0.0;  ///< probability of dropping a response
  double duplicate = 0.0;   ///< probability of delivering two copies
  std::chrono::milliseconds delay_min{0};  ///< uniform delay lower bound
  std::chrono::milliseconds delay_max{0};  ///< uniform delay upper bound
  std::chrono::milliseconds reorder{0};    ///< extra uniform delay in [0, reorder]
};

/// A cut between two sets of workers (Note [fault events]).
struct fault_partition {
  std::vector<std::string> side_a, side_b;  ///< worker names
  std::chrono::milliseconds duration{0};    ///< 0: until fault_injector::heal()
  bool hold = false;                        ///< delay traffic until the cut ends instead of dropping it
};

/// What a process does at a fault point (Note [fault events]).
enum class point_action : std::uint8_t { kill = 0, pause = 1, delay = 2 };

/// Heartbeats (and all else) from workers `from` to workers `to` lost (Note [fault events]).
struct fault_silence {
  std::vector<std::string> from, to;      ///< worker names
  std::chrono::milliseconds duration{0};  ///< 0: until fault_injector::heal()
};

/// A kill or pause at a named fault point (fault_point(node, point, step)).
struct fault_point_event {
  point_action action = point_action::kill;
  std::string point;                      ///< "step", "forward", "backward", "allreduce", "checkpoint" or a user name
  std::int64_t step = 0;                  ///< the step the point must report
  std::string worker;                     ///< the worker it applies to; empty: any
  std::chrono::milliseconds duration{0};  ///< pause or delay length
};

/// A seed, its rules (first match wins) and its events.
struct fault_plan {
  std::uint64_t seed = 0;
  std::vector<fault_rule> rules;
  std::vector<fault_partition> partitions;
  std::vector<fault_point_event> points;
  std::vector<fault_silence> silences;

  /// Parses the text format of Note [fault plan]: lines `seed N` and `rule KEY k=v...`; `#`
  /// starts a comment. Throws troupe::error(bad_argument) naming the line and the bad field.
  static fault_plan parse(const std::string& text);
  /// Reads and parses a file. Throws io_error (unreadable) or bad_argument naming the file and
  /// the line.
  static fault_plan load(const std::string& path);
  /// The plan in the text format (parse(to_string()) gives an equal plan).
  std::string to_string() const;
};

/// What an injector has done so far (for tests and logs).
struct fault_counters {
  std::uint64_t seen = 0, dropped_requests = 0, dropped_replies = 0, duplicated = 0, delayed = 0;
  std::uint64_t partitioned = 0, held = 0, points_fired = 0;
};

/// A counter-based random number in [0, 1) for (seed, key, n, stream): the plan's only source of
/// randomness (splitmix64 of a hash of the inputs).
double fault_random(std::uint64_t seed, const std::string& key, std::uint64_t n, std::uint32_t stream);

/// The transport hook that applies a fault_plan. Thread-safe, never blocks (one mutex around
/// counters). Share one instance among the nodes of a process.
/// Every fault it applies is written to its log as one line (`troupe-fault: ...`) when it
/// happens. A summary line follows when it is destroyed (Note [fault schedule]). A kill or pause
/// event fires on the thread that calls on_point.
class fault_injector : public transport_hook {
 public:
  /// Receives one line of the schedule (no newline).
  using log_sink = std::function<void(const std::string&)>;

  explicit fault_injector(fault_plan plan, log_sink log = nullptr);
  /// Writes the summary line to the log.
  ~fault_injector() override;

  transport_decision on_send(envelope& msg) override;
  transport_decision on_receive(envelope& msg) override;
  /// Applies a kill or pause event of the plan that names (worker, point, step). A kill does
  /// not return. A pause returns after the process was continued.
  void on_point(const std::string& worker, const std::string& point, std::int64_t step) override;
  /// The injector's start while a dropping partition or dropped heartbeats cut `to` off from
  /// `from` (Note [silent peers]).
  std::optional<std::chrono::steady_clock::time_point> silent_since(const std::string& from, const std::string& to) override;
  bool may_silence() const override;

  /// Ends every partition now (those without a duration included); held traffic is delivered.
  void heal();
  /// A log sink writing lines to stderr.
  static log_sink stderr_log();

  /// Counters so far.
  fault_counters counters() const;
  /// The plan.
  const fault_plan& plan() const { return plan_; }

 private:
  const fault_rule* rule_for(message_kind kind, const std::string& function) const;
  std::string function_of(envelope& msg, bool forget);
  bool partition_decision(const envelope& msg, transport_decision& d);
  void log(const std::string& line);

  fault_plan plan_;
  mutable std::mutex mutex_;
  std::map<std::string, std::uint64_t> sequence_;  // per key
  std::map<std::pair<std::string, std::uint64_t>, std::string> calls_;  // (peer, call id) -> function
  fault_counters counters_;
  log_sink log_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point healed_ = std::chrono::steady_clock::time_point::max();
};

/// Reports that `n`'s process reached the named point at `step` (Note [fault events]). Applies
/// a kill or pause of the node's fault plan; a no-op without one. Cheap; call it from any thread.
void fault_point(node& n, const std::string& point, std::int64_t step);

}  // namespace troupe
