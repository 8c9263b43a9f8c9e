#pragma once
// Note [silent peers]
//
// A fault plan may cut two workers apart, or drop one's heartbeats to another. That stops what
// the transport would see of a frozen peer only in part: the CAF heartbeat and the connections
// are not faulted. So a node whose hook may silence peers (transport_hook::may_silence) runs
// this watch. Every period it asks the hook, for each peer it is linked to, since when that peer
// has been silent towards this node. Once that is the peer timeout (connection_timeout) or
// longer, it declares the peer lost through the agent, as its heartbeat would. Pending calls to
// it fail with peer_lost naming it, and peer_events publishes the loss. A lost peer that is
// linked again while still silent is lost again at the next check. Without such a hook nothing
// runs.
//
//   watch thread --period--> hook.silent_since(peer, me) >= timeout? --declare(peer)--> agent

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "troupe/actors/transport.hpp"

namespace troupe::detail {

/// Watches for peers silent past the peer timeout (Note [silent peers]); the thread stops and
/// is joined on destruction.
class silence_watch {
 public:
  using peer_list = std::function<std::vector<std::string>()>;
  using declare = std::function<void(const std::string& peer, const std::string& reason)>;

  silence_watch(std::string self, std::shared_ptr<transport_hook> hook, std::chrono::milliseconds timeout, peer_list peers,
                declare lost);
  ~silence_watch();
  silence_watch(const silence_watch&) = delete;
  silence_watch& operator=(const silence_watch&) = delete;

 private:
  void run();
  void check();

  std::string self_;
  std::shared_ptr<transport_hook> hook_;
  std::chrono::milliseconds timeout_;
  peer_list peers_;
  declare lost_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace troupe::detail
