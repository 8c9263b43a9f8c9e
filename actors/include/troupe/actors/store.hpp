#pragma once
/// \file store.hpp
/// The rendezvous store: a key/value actor hosted by rank 0, and the blocking client every node
/// uses (`node::store()`).
///
/// Note [store]
///
/// One actor on rank 0 holds string keys -> byte-string values, counters (decimal strings),
/// waiters and barriers. Every request is checked against the job token (the sender's node must
/// have said hello, Note [job token]). Waiting operations (get of a missing key, wait, barrier)
/// park a response promise with a deadline. The store answers each exactly once: when the keys
/// appear / every rank arrived, or with `timeout` at the deadline. A barrier that times out fails
/// every rank waiting in it, naming the ranks that did not arrive, and is forgotten.
///
///   rank r --store_barrier{name, r, world, timeout}--> store
///   store: arrived[name] += r; all arrived? -> unit to each; deadline? -> timeout "missing 2,3"
///
/// Clients bound every request by its timeout plus a grace period, and watch the store host.
/// So a dead store host ends every pending call in `peer_lost` naming it, never in a hang
/// (Note [store client] in src/store_client.cpp). Every node learns of that loss at once through
/// its peer-loss events (`peer_events::store_host_lost()`). A later call reconnects within one
/// bounded window. While the store host does not answer, the call fails with `peer_lost` naming
/// it (Note [lost peer re-admission]).

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace troupe {

class peer_events;

namespace detail {
struct store_client_impl;
}

/// Blocking client of the store. Thread-safe; each call blocks the calling thread (never use it
/// inside an actor). Every call throws troupe::error: `timeout`, `peer_lost` (the store host is
/// gone), `unauthorized`, `bad_argument` (add on a non-integer value), `invalid_state` after
/// shutdown.
class store_client {
 public:
  explicit store_client(std::unique_ptr<detail::store_client_impl> impl);
  ~store_client();
  store_client(const store_client&) = delete;
  store_client& operator=(const store_client&) = delete;

  /// Sets `key` to `value` (bytes), waking waiters.
  void set(const std::string& key, const std::string& value);
  /// The value of `key`, waiting up to `timeout` for it to be set.
  std::string get(const std::string& key, std::chrono::milliseconds timeout);
  /// Adds `delta` to the integer counter `key` (absent = 0); returns the new value.
  std::int64_t add(const std::string& key, std::int64_t delta);
  /// Waits until every key is set, up to `timeout` (errc::timeout names the missing keys).
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  /// Sets `key` to `desired` if its value is `expected` (an absent key matches ""); returns the
  /// value after the operation.
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired);
  /// Erases `key`; returns whether it existed.
  bool erase(const std::string& key);
  /// The number of keys.
  std::int64_t num_keys();
  /// Blocks until `world_size` ranks called barrier(name) or `timeout` passed; errc::timeout
  /// names the ranks that did not arrive.
  void barrier(const std::string& name, std::int32_t rank, std::int32_t world_size, std::chrono::milliseconds timeout);

  /// The peer-loss events of the node this client belongs to (Note [peer loss events]); null
  /// for a client without a node. Process groups built on this store subscribe to them.
  std::shared_ptr<peer_events> peer_losses() const;

 private:
  std::unique_ptr<detail::store_client_impl> impl_;
};

}  // namespace troupe
