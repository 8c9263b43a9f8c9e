#pragma once
// The propagations a served run started, answered without the context actor when they all end
// done (Note [direct requests]).

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <caf/actor.hpp>
#include <caf/message.hpp>

#include "container_impl.hpp"

namespace troupe::dist_autograd {

/// One engine run on a service's thread (an incoming propagation) and the first attempts of the
/// propagations it started. When the run ended and every attempt answered done, the incoming
/// propagation is answered on the thread that completed it. Otherwise the attempts go to the
/// context actor with their answers, and the actor answers. Thread-safe.
class nested_run : public std::enable_shared_from_this<nested_run> {
 public:
  nested_run(std::weak_ptr<container::impl> c, std::shared_ptr<context_state> ctx, std::uint64_t group,
             std::uint64_t pass, bool retain);

  /// Sends attempt 1 of a propagation to `to` (service `peer`) from this thread.
  void send(const std::string& to, caf::actor peer, message_id msg, const tensor_list& grads);
  /// The run ended with `local`. `done` answers the incoming propagation `key`, now when every
  /// attempt answered already, else once the last one did.
  void close(propagate_answer local, std::pair<message_id, std::uint64_t> key, answer_ptr<propagate_answer> done);

 private:
  struct attempt : propagation_attempt {
    std::optional<propagate_answer> answer;
  };
  void on_reply(std::size_t slot, caf::message&& reply);
  /// True once: the run closed and every attempt answered (m_ held).
  bool ready();
  void finish();
  void answer_here(const propagate_answer& outcome);
  void hand_over();

  std::weak_ptr<container::impl> c_;
  std::shared_ptr<context_state> ctx_;
  const std::uint64_t group_, pass_;
  const bool retain_;
  std::mutex m_;
  std::vector<attempt> attempts_;
  std::size_t answered_ = 0;
  bool closed_ = false, finished_ = false;
  propagate_answer local_;
  std::pair<message_id, std::uint64_t> key_;
  answer_ptr<propagate_answer> done_;
};

}  // namespace troupe::dist_autograd
