#pragma once
// Large tensors between processes of one host travel through shared memory, not the CAF
// connection (CAF-0.17-NOTES pitfall 8: one TCP connection per node pair, head-of-line blocking).
//
// Note [tensor over shared memory]
// While a node encodes a payload for a peer on the same host (same CAF host id), a bulk_scope
// is active on the encoding thread. write_tensor then puts every tensor of at least
// `bulk_threshold` bytes into a fresh POSIX shared-memory segment "/troupe_rpc_<pid>_<n>" and
// writes only its name (tensor kind 1). The receiver's read_tensor opens the segment, copies the
// bytes into a new tensor, and unlinks the name: one copy in, one copy out, nothing queued on
// the connection. A segment whose message is never decoded (dropped, timed out, receiver died)
// is unlinked by the sending node at teardown (the node records every name it created).
//
//   sender: shm_open+memcpy --name--> [CAF] --> receiver: shm_open+memcpy+shm_unlink
//
// Only names with the "/troupe_rpc_" prefix are ever opened or unlinked by a receiver.

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/node_id.hpp>

namespace troupe::detail {

/// Names of the segments a node created (for unlinking leftovers at teardown). Thread-safe.
class bulk_names {
 public:
  void add(std::string name);
  /// Unlinks every recorded name still present.
  void unlink_all();

 private:
  std::mutex mutex_;
  std::vector<std::string> names_;
};

/// Tensors at least this large go through shared memory between same-host processes.
inline constexpr std::size_t bulk_threshold = std::size_t{1} << 20;

/// Makes write_tensor use shared memory on this thread while alive (nested scopes restore).
class bulk_scope {
 public:
  bulk_scope(bool enabled, bulk_names* names);
  ~bulk_scope();
  bulk_scope(const bulk_scope&) = delete;
  bulk_scope& operator=(const bulk_scope&) = delete;

 private:
  bool prev_enabled_;
  bulk_names* prev_names_;
};

/// Whether two CAF nodes run on the same host.
bool same_host(const caf::node_id& a, const caf::node_id& b);

}  // namespace troupe::detail
