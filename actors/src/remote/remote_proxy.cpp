// The CAF proxy of a remote actor (Note [remote actors] in remote/remote_actors.hpp).
#include "remote/remote_proxy.hpp"

#include <caf/actor_cast.hpp>
#include <caf/atom.hpp>
#include <caf/make_message.hpp>
#include <caf/sec.hpp>
#include <caf/system_messages.hpp>

#include "remote/remote_actors.hpp"

namespace troupe::detail {

namespace {
// Open requests kept per proxy before answered or dead requesters are pruned.
constexpr std::size_t open_prune_at = 4096;
}  // namespace

remote_proxy::remote_proxy(caf::actor_config& cfg, std::weak_ptr<remote_actors> layer) : caf::actor_proxy(cfg), layer_(std::move(layer)) {}

remote_proxy::~remote_proxy() = default;

caf::error remote_proxy::gone_error() const {
  if (reason_ && reason_ != caf::exit_reason::normal) return reason_;
  std::string where = "actor " + std::to_string(id());
  if (auto l = layer_.lock()) where += " on worker " + l->worker_of(node());
  return caf::make_error(caf::sec::request_receiver_down, where + " has exited");
}

void remote_proxy::enqueue(caf::mailbox_element_ptr what, caf::execution_unit*) {
  const auto mid = what->mid;
  auto sender = std::move(what->sender);
  auto layer = layer_.lock();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (killed_ || !layer) {
      remote_actors::bounce(sender, mid, killed_ ? gone_error() : caf::make_error(caf::sec::request_receiver_down, "the node is shut down"));
      return;
    }
    if (mid.is_request() && sender) {
      if (open_.size() >= open_prune_at) std::erase_if(open_, [](const auto& kv) { return !kv.second.requester.lock(); });
      open_.emplace(std::make_pair(sender->id(), mid.request_id().integer_value()), open_request{caf::actor_cast<caf::weak_actor_ptr>(sender), mid});
    }
  }
  auto content = what->move_content_to_message();
  if (content.match_elements<caf::exit_msg>()) unlink_from(content.get_as<caf::exit_msg>(0).source);
  layer->forward(node(), std::move(sender), id(), mid, std::move(content));
}

void remote_proxy::answered(caf::actor_id requester, caf::message_id request_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  open_.erase(std::make_pair(requester, request_id.request_id().integer_value()));
}

bool remote_proxy::add_backlink(caf::abstract_actor* x) {
  if (!caf::monitorable_actor::add_backlink(x)) return false;
  if (auto l = layer_.lock()) l->forward_later(node(), id(), caf::make_message(caf::link_atom::value, x->ctrl()));
  return true;
}

bool remote_proxy::remove_backlink(caf::abstract_actor* x) {
  if (!caf::monitorable_actor::remove_backlink(x)) return false;
  if (auto l = layer_.lock()) l->forward_later(node(), id(), caf::make_message(caf::unlink_atom::value, x->ctrl()));
  return true;
}

void remote_proxy::kill_proxy(caf::execution_unit* ctx, caf::error reason) {
  decltype(open_) open;
  caf::error err;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (killed_) return;
    killed_ = true;
    reason_ = reason;
    open.swap(open_);
    err = gone_error();
  }
  for (auto& [key, r] : open) remote_actors::bounce(caf::actor_cast<caf::strong_actor_ptr>(r.requester), r.mid, err);
  cleanup(std::move(reason), ctx);
}

}  // namespace troupe::detail
