#pragma once
// The checks a group without an in-band control channel (NCCL) makes through the rendezvous
// store: collective fingerprints and the monitored barrier.
//
// Note [NCCL fingerprints]
// ------------------------
// Before a collective launches, every rank publishes its fingerprint under
// "<prefix>/fp/<seq>/<rank>": sequence number, op, dtype, shape. It reads every other rank's
// key of the same sequence number:
//
//   rank 0: set fp/7/0 "allreduce(sum) float32[16]"   get fp/7/1  -> compare -> launch or fail
//   rank 1: set fp/7/1 "allreduce(sum) float32[16]"   get fp/7/0  -> compare -> launch or fail
//
// - Agreement: the collective launches.
// - A different fingerprint: collective_mismatch on every rank (each sees the other's key),
//   naming both ranks and both fingerprints. Nothing launched, so the group stays usable.
// - A key that does not come by the deadline: timeout naming the ranks that never issued the
//   collective (dead or hung). The caller aborts the communicator.
// Keys stay bounded. Once every rank published sequence n, all of them read this rank's key of
// n - 1, so it is erased. Stores without erase keep them in their directory.
// - A rank whose payload the fault plan dropped (Note [collective payload faults]) publishes
//   "<seq> !lost <reason>" instead: every rank that reads it fails with peer_lost and the reason.
//   A repeated payload sets the same key again; each rank reads a key once, so nothing changes.
// The monitored barrier uses the same exchange under "<prefix>/mb/<k>/<rank>".
// Assumes: every rank issues its collectives in the same order. Costs one write and
// world_size - 1 reads per collective, on the calling thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "troupe/tensors/error.hpp"

namespace troupe::ddp::detail {

/// The store operations the checks need; `erase` may be empty.
struct check_store {
  std::function<void(const std::string&, const std::string&)> set;
  std::function<std::string(const std::string&, std::chrono::milliseconds)> get;
  std::function<void(const std::string&)> erase;
};

/// Fingerprint comparison and monitored barrier through a store (Note [NCCL fingerprints]).
/// Used from one thread at a time (the caller serialises collectives).
class store_checks {
 public:
  /// `label` prefixes every message ("nccl_process_group 'g' rank 0 on cuda:0").
  store_checks(check_store store, std::string prefix, int rank, int world_size, std::string label);

  /// Publishes this rank's `fingerprint` of collective `seq` and compares it with every other
  /// rank's. Blocks up to `timeout`. Returns nullopt when all agree, collective_mismatch
  /// naming the first rank that differs, or timeout naming the ranks that did not publish.
  std::optional<troupe::error> compare(std::uint64_t seq, const std::string& fingerprint, std::chrono::milliseconds timeout);
  /// Publishes that this rank's payload of collective `seq` was lost with `reason` (see the
  /// note). Never waits for the others. Throws what the store throws.
  void publish_lost(std::uint64_t seq, const std::string& reason);
  /// Sets this rank's last published fingerprint key again (a repeated payload). Throws what
  /// the store throws.
  void repeat_last();
  /// Blocks until every rank arrived at this barrier; throws timeout naming the ranks that did
  /// not arrive within `timeout`.
  void monitored_barrier(std::chrono::milliseconds timeout);

 private:
  /// Sets this rank's key under `base` to `mine`, reads the others' (empty string: missing).
  std::vector<std::optional<std::string>> exchange(const std::string& base, const std::string& mine,
                                                   std::chrono::milliseconds timeout);
  void erase_own(const std::string& base);

  check_store store_;
  std::string prefix_;
  int rank_;
  int world_;
  std::string label_;
  std::uint64_t barriers_ = 0;
  std::optional<std::string> last_fp_base_;
  std::string last_mine_;  // the value set under last_fp_base_
};

}  // namespace troupe::ddp::detail
