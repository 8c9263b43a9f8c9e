#pragma once
// Faults on the collective payloads of a CPU process group.
//
// Note [collective payload faults]
// A group given process_group_options::payload_faults asks it once per collective, and once per
// send, on the worker thread, before this rank's payload leaves. The question is an envelope of
// kind collective_payload: the collective ("allreduce", "send", ...), its sequence number, "rank
// R" of the group and its note ("bucket 2"). env_process_group passes its node's fault plan
// (node::payload_fault), whose `collective...` rules answer (docs/faults.md). The answer:
//   drop   this rank's payload is lost. Its collective fails at once with io_error naming the
//          rank, the collective and the plan; the group breaks and aborts its transport, so
//          every peer that waits for this rank fails at once with peer_lost naming it, never
//          at the deadline. Later collectives of the group fail at once, as after any failure.
//   delay  this rank enters the collective that much later, so its payload arrives late. The
//          peers wait; past blame_after they name it as the rank that never entered. A delay
//          below the timeout changes no bit of any result. A reorder window is a random delay:
//          one rank's payloads keep their order (the worker runs them in issue order), they
//          only fall out of step with the other ranks'.
//   repeat this rank's entry is delivered a second time, late: after its collective completed,
//          the rank sends the entry again (a send: the whole message), carrying the same
//          sequence number. The receivers discard it by that number, so no result changes.
//          Shared memory: the entry is the rank's counter (fp_seq, or p2p_sent of a send),
//          published again with the same value; a wait for a higher value ignores it. TCP:
//          the fingerprint frame goes around again; the next rank reads it where it waits for
//          the next collective's entries, sees an older sequence number and drops it (a send:
//          the receiver's next recv drops a message whose number it has received). A copy
//          larger than the socket buffers completes its send when the receiver's next recv
//          runs. The rank records "<op> repeat" in the flight recorder; a TCP receiver that
//          drops one records "repeat discarded" on the collective it dropped it in.
// drop_reply is refused when the plan is parsed: a collective has no reply to lose.
//
//   worker: issue #s --ask(envelope)--> drop: throw io_error --> abort --> peers: peer_lost
//                                        delay d: wait d (stop() ends it) --> run #s
//                                        repeat: run #s --> send the entry of #s again
//
// Costs: without a hook one branch per collective; with one, an envelope and a call per
// collective (the plan's mutex and counters).

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "troupe/actors/transport.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::ddp::detail {

/// One group's hook of Note [collective payload faults]. Thread-safe.
class payload_faults {
 public:
  using hook_fn = std::function<transport_decision(envelope&)>;

  payload_faults(hook_fn hook, std::string group, int rank);
  payload_faults(const payload_faults&) = delete;
  payload_faults& operator=(const payload_faults&) = delete;

  /// Whether a hook is set (false: apply is never needed).
  explicit operator bool() const noexcept { return static_cast<bool>(hook_); }
  /// What becomes of one payload.
  enum class fate { deliver, drop, repeat };
  /// Asks the hook about this rank's payload of `op` #`seq` (`note` may be empty). Waits out a
  /// delay (stop() ends the wait); returns whether the payload is dropped, repeated or not.
  fate apply(const std::string& op, std::uint32_t seq, const std::string& note);
  /// The error of a dropped payload of `op` #`seq`.
  troupe::error dropped(const std::string& op, std::uint32_t seq) const;
  /// Ends a delay in progress and every later one at once. Never blocks long; never throws.
  void stop() noexcept;

 private:
  hook_fn hook_;
  std::string group_;
  int rank_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopped_ = false;
};

}  // namespace troupe::ddp::detail
