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
  message_id msg = 0;
  std::uint64_t pass = 0;
  bool retain = false;
  tensor_list grads;
  int attempt = 0;       ///< attempts made so far
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
  // release
  std::set<std::string> pending;        ///< workers whose release has not ended yet
  std::map<std::string, int> attempts;  ///< attempts made per worker in this release
  std::vector<answer_ptr<std::int32_t>> waiting;
  std::int32_t released = 0;
  bool final = false;
  // PropagateGradients
  std::map<std::uint64_t, outgoing_propagation> out;  ///< by seq
  std::map<std::uint64_t, ctx_propagate_ack> early;   ///< first-attempt acks that came before their await
  std::map<std::uint64_t, propagation_group> groups;  ///< by group id
  std::map<std::pair<message_id, std::uint64_t>, incoming_outcome> incoming;
  std::uint64_t next_park = 0;
  static inline const char* name = "troupe.dist.context";
};
using context_self = context_handle::stateful_pointer<context_actor_state>;

// propagation.cpp
void on_propagate_ack(context_self self, const ctx_propagate_ack& a);
void on_propagate_retry(context_self self, std::uint64_t seq);
void on_await(context_self self, ctx_await& w);
void on_duplicate(context_self self, ctx_duplicate& d);
void on_running_timeout(context_self self, std::uint64_t park);

}  // namespace troupe::dist_autograd
