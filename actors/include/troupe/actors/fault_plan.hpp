#pragma once
/// \file fault_plan.hpp
/// A seeded, replayable fault plan for the transport hook (Note [transport hook]).
///
///   troupe::fault_plan plan = troupe::fault_plan::parse(
///       "seed 7\n"
///       "rule troupe.rref.fork_request fail_first=2 drop=0.1\n"
///       "rule * delay=1..5 reorder=10\n");
///   auto hook = std::make_shared<troupe::fault_injector>(plan);
///   troupe::node n(opts, fns, hook);
///
/// Note [fault plan]
/// A plan is a seed and a list of rules. A rule matches a message by its key: the function name
/// of the call (requests and the responses to them), or "rpc_request" / "rpc_response" /
/// "actor_message" (every message of that kind), or "*" (everything). Remote actor messages
/// (requests, responses and one-way sends alike) are faulted as requests. The first matching rule decides. Per rule:
///   fail_first=N   drops the first N requests of the key that leave this injector (PyTorch's
///                  faulty agent fails the first sends of fork request, child accept, user delete)
///   drop=p         drops a request with probability p (a lost request: the callee never runs)
///   drop_reply=p   drops a response with probability p (a lost reply: the callee ran)
///   duplicate=p    delivers two copies with probability p
///   delay=a..b     delays every message by a uniform time in [a, b] ms
///   reorder=w      delays every message by a uniform time in [0, w] ms, so later messages
///                  overtake earlier ones within a window of w ms
/// Counts are at most 2^31 - 1 (fail_first) and times at most fault_rule::max_delay_ms (an hour);
/// anything else is refused like any malformed field.
/// Decisions are taken on send only (on_receive passes everything), so one injector shared by
/// every node of a test process faults each message once.
///
/// Replay: every decision is a counter-based random number of (seed, key, n, decision), where n
/// is the sequence number of the message among those of its key seen by this injector. The same
/// seed and the same per-key message sequence give the same faults; no state but counters.
///
/// Responses carry no function name; the injector remembers (peer, call id) -> function when it
/// sees the request (on send of the caller or on receive of the callee) and forgets it when the
/// response passes.

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "troupe/actors/transport.hpp"

namespace troupe {

/// The faults applied to messages of one key (Note [fault plan]).
struct fault_rule {
  /// The largest delay, lower or upper bound, or reorder window a plan may set (one hour).
  static constexpr long max_delay_ms = 3'600'000;
  std::string match = "*";  ///< function name, "rpc_request", "rpc_response" or "*"
  int fail_first = 0;       ///< drop the first N requests
  double drop = 0.0;        ///< probability of dropping a request
  double drop_reply = 0.0;  ///< probability of dropping a response
  double duplicate = 0.0;   ///< probability of delivering two copies
  std::chrono::milliseconds delay_min{0};  ///< uniform delay lower bound
  std::chrono::milliseconds delay_max{0};  ///< uniform delay upper bound
  std::chrono::milliseconds reorder{0};    ///< extra uniform delay in [0, reorder]
};

/// A seed and its rules (first match wins).
struct fault_plan {
  std::uint64_t seed = 0;
  std::vector<fault_rule> rules;

  /// Parses the text format of Note [fault plan]: lines `seed N` and `rule KEY k=v...`; `#`
  /// starts a comment. Throws troupe::error(bad_argument) naming the line and the bad field.
  static fault_plan parse(const std::string& text);
  /// Reads and parses a file. Throws io_error (unreadable) or bad_argument.
  static fault_plan load(const std::string& path);
  /// The plan in the text format (parse(to_string()) gives an equal plan).
  std::string to_string() const;
};

/// What an injector has done so far (for tests and logs).
struct fault_counters {
  std::uint64_t seen = 0, dropped_requests = 0, dropped_replies = 0, duplicated = 0, delayed = 0;
};

/// A counter-based random number in [0, 1) for (seed, key, n, stream): the plan's only source of
/// randomness (splitmix64 of a hash of the inputs).
double fault_random(std::uint64_t seed, const std::string& key, std::uint64_t n, std::uint32_t stream);

/// The transport hook that applies a fault_plan. Thread-safe, never blocks (one mutex around
/// counters). Share one instance among the nodes of a process.
class fault_injector : public transport_hook {
 public:
  explicit fault_injector(fault_plan plan);

  transport_decision on_send(envelope& msg) override;
  transport_decision on_receive(envelope& msg) override;

  /// Counters so far.
  fault_counters counters() const;
  /// The plan.
  const fault_plan& plan() const { return plan_; }

 private:
  const fault_rule* rule_for(message_kind kind, const std::string& function) const;
  std::string function_of(envelope& msg, bool forget);

  fault_plan plan_;
  mutable std::mutex mutex_;
  std::map<std::string, std::uint64_t> sequence_;  // per key
  std::map<std::pair<std::string, std::uint64_t>, std::string> calls_;  // (peer, call id) -> function
  fault_counters counters_;
};

}  // namespace troupe
