#pragma once
// The CAF proxy of an actor in another process (Note [remote actors] in
// remote/remote_actors.hpp).

#include <caf/actor_proxy.hpp>
#include <caf/mailbox_element.hpp>

#include <map>
#include <memory>
#include <mutex>

namespace troupe::detail {

class remote_actors;

/// Forwards every message to its node through remote_actors; remembers the requests it forwarded
/// until their response passes back, so that a kill fails them at once. Thread-safe.
class remote_proxy final : public caf::actor_proxy {
 public:
  remote_proxy(caf::actor_config& cfg, std::weak_ptr<remote_actors> layer);
  ~remote_proxy() override;

  void enqueue(caf::mailbox_element_ptr what, caf::execution_unit* ctx) override;
  bool add_backlink(caf::abstract_actor* x) override;
  bool remove_backlink(caf::abstract_actor* x) override;
  /// Fails the open requests with `reason` (or request_receiver_down for a normal exit), then
  /// runs CAF's cleanup: monitors get down_msg, links exit_msg.
  void kill_proxy(caf::execution_unit* ctx, caf::error reason) override;
  /// The response to request `request_id` of local actor `requester` arrived.
  void answered(caf::actor_id requester, caf::message_id request_id);

 private:
  caf::error gone_error() const;
  std::weak_ptr<remote_actors> layer_;
  std::mutex mutex_;
  bool killed_ = false;
  caf::error reason_;
  struct open_request {
    caf::weak_actor_ptr requester;
    caf::message_id mid;
  };
  // (requester, request id) -> the request, for the requests forwarded and not answered yet.
  std::map<std::pair<caf::actor_id, std::uint64_t>, open_request> open_;
};

}  // namespace troupe::detail
