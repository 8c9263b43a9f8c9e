#pragma once
// The state of a context actor and its handlers, shared by context_actor.cpp (behaviour, release)
// and propagation.cpp (PropagateGradients); Note [context actor] in context_actor.hpp.

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "context_actor.hpp"

namespace troupe::dist_autograd {

/// One PropagateGradients this worker sends (until it ended).
struct outgoing_propagation {
  std::uint64_t group = 0;
  std::string to;
  caf::actor peer;  ///< the service of `to`
  message_id msg = 0;
  std::uint64_t pass = 0;
  bool retain = false;
  tensor_list grads;
  int attempt = 0;       ///< attempts made so far (the replies of older ones are ignored)
  int timeouts = 0;      ///< attempts that timed out
  std::chrono::steady_clock::time_point give_up;  ///< start + backward_timeout (polls end there)
};

/// The propagations one engine run handed over, and who waits for them.
struct propagation_group {
  std::size_t ended = 0;
  bool awaited = false;
  std::size_t expected = 0;
  propagate_answer first_failure{propagate_done, 0, {}};
  propagate_answer local{propagate_done, 0, {}};
  std::pair<message_id, std::uint64_t> key{0, 0};
  answer_ptr<propagate_answer> done;
};

/// An incoming propagation's outcome, and the duplicates parked until it is known.
struct incoming_outcome {
  bool known = false;
  propagate_answer answer;
  std::map<std::uint64_t, answer_ptr<propagate_answer>> parked;  ///< by park id
};

struct context_actor_state {
  node* n = nullptr;
  container_options opts;
  std::shared_ptr<context_state> record;
  std::map<caf::actor_addr, std::string> watched;  ///< the peer services monitored, to their worker
  // release
  std::set<std::string> pending;        ///< workers whose release has not ended yet
  std::map<std::string, int> attempts;  ///< attempts made per worker in this release
  std::map<std::string, caf::actor> peers;  ///< the services of the workers released
  std::vector<answer_ptr<std::int32_t>> waiting;
  std::int32_t released = 0;
  bool final = false;
  // PropagateGradients
  std::map<std::uint64_t, outgoing_propagation> out;  ///< by seq
  std::map<std::uint64_t, propagation_group> groups;  ///< by group id
  std::map<std::pair<message_id, std::uint64_t>, incoming_outcome> incoming;
  std::uint64_t next_park = 0;
  static inline const char* name = "troupe.dist.context";
};
using context_self = context_handle::stateful_pointer<context_actor_state>;

/// Monitors the service `peer` of `worker` (once).
void watch(context_self self, const caf::actor& peer, const std::string& worker);

// propagation.cpp
void on_start(context_self self, ctx_start& p);
void on_propagate_retry(context_self self, std::uint64_t seq);
/// A down_msg of `worker`'s service: its propagations fail with (`code`, `why`).
void on_peer_down(context_self self, const std::string& worker, errc code, const std::string& why);
void on_await(context_self self, ctx_await& w);
void on_duplicate(context_self self, ctx_duplicate& d);
void on_running_timeout(context_self self, std::uint64_t park);

}  // namespace troupe::dist_autograd
