#pragma once
/// \file peer_events.hpp
/// A node's peer-loss events: who was lost, and whether it was the store host. Layers above
/// (process groups) subscribe here instead of detecting lost peers themselves.
///
/// Note [peer loss events]
///
/// A node declares a peer lost when its agent's monitor of the peer's agent fires. A dead
/// process is lost at once (EOF), a frozen one after node_options::connection_timeout without
/// a heartbeat. Each loss is published once to every subscriber, on the agent's thread, after
/// the node failed the calls pending to that peer. A stall shorter than connection_timeout is
/// no loss: nothing is published and nothing in flight fails.
///
///   peer frozen/dead --(heartbeat / EOF)--> agent down_msg --> fail pending calls to it
///                                                           --> each listener(peer_loss)
///                                                           --> store host? store_host_lost()
///
/// `watch(workers)` connects to each worker (store lookup, connect, hello), so that the node
/// monitors it even when it never calls it. A process group watches all its members.
/// Note [lost peer re-admission]: a lost peer that answers again is re-admitted. The next call
/// to it reconnects within one bounded window and succeeds; so does the next store call, for
/// the store host. While the peer does not answer, each such call fails with peer_lost naming
/// it. In the window, a dial that nobody admits ends the try at once, unless the store names a
/// newer address (a replacement's). A dial that a live peer admitted is made again
/// (Note [CAF connect tick] in src/peer_dialer.hpp). The window is connection_timeout, at least 1 s.
/// Losses are never taken back: what failed stays failed. A process group that lost a member
/// stays broken: its collectives fail with peer_lost naming the member; make a new group.
/// The peer sees the dropped links as losses of its own peers, so both sides fail alike and
/// neither is half-connected.

#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace troupe {

/// One lost peer.
struct peer_loss {
  std::string worker;       ///< the lost worker's name ("worker2")
  std::string reason;       ///< why, as the transport saw it
  bool store_host = false;  ///< the worker hosts the job's store (rank 0)
};

/// The peer-loss events of one node. Thread-safe; shared (shared_ptr) by the node and its
/// store client, so subscribers may outlive the node (they then get no more events).
class peer_events {
 public:
  using listener = std::function<void(const peer_loss&)>;
  /// Connects to a worker so that its loss is detected; throws troupe::error.
  using connector = std::function<void(const std::string& worker, std::chrono::milliseconds timeout)>;

  /// Unsubscribes on destruction; after that the listener is never called again (a call in
  /// progress on another thread finishes first). Move-only.
  class subscription {
   public:
    subscription() = default;
    subscription(std::shared_ptr<peer_events> owner, std::uint64_t id) : owner_(std::move(owner)), id_(id) {}
    ~subscription();
    subscription(subscription&& o) noexcept : owner_(std::move(o.owner_)), id_(o.id_) {}
    subscription& operator=(subscription&& o) noexcept;
    subscription(const subscription&) = delete;
    subscription& operator=(const subscription&) = delete;

   private:
    std::shared_ptr<peer_events> owner_;
    std::uint64_t id_ = 0;
  };

  /// `self`: this node's worker name; `connect` makes the node watch a worker.
  peer_events(std::string self, connector connect);

  /// This node's worker name.
  const std::string& self() const noexcept { return self_; }
  /// The store host's worker name (empty until the node joined).
  std::string store_host() const;
  /// Names the store host (the node, once it joined).
  void set_store_host(std::string worker);

  /// Calls `l` for every later loss (Note [peer loss events]). `l` runs on the node's agent
  /// thread: it must not block or call into the node. Never blocks.
  [[nodiscard]] static subscription subscribe(const std::shared_ptr<peer_events>& events, listener l);
  /// Connects to each of `workers` (not already connected) so their loss is detected. Blocks up
  /// to `timeout` per worker. Throws troupe::error: peer_lost (a worker does not answer),
  /// timeout, invalid_state (the node shut down).
  void watch(const std::vector<std::string>& workers, std::chrono::milliseconds timeout);
  /// Becomes ready with the first loss of the store host. Never blocks.
  std::shared_future<peer_loss> store_host_lost() const { return store_lost_future_; }

  /// Publishes a loss (the node calls this on its agent's thread); sets loss.store_host.
  void notify(peer_loss loss);
  /// Detaches from the node (teardown): watch() then throws invalid_state.
  void detach();

 private:
  void unsubscribe(std::uint64_t id);

  std::string self_;
  std::string store_host_;
  std::mutex connect_mu_;
  connector connect_;
  mutable std::mutex mu_;  // held while listeners run, so unsubscribe waits for a running one
  std::map<std::uint64_t, listener> listeners_;
  std::uint64_t next_id_ = 1;
  bool store_lost_ = false;
  std::promise<peer_loss> store_lost_promise_;
  std::shared_future<peer_loss> store_lost_future_;
};

}  // namespace troupe
