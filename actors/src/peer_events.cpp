// A node's peer-loss events (Note [peer loss events] in troupe/actors/peer_events.hpp).
#include "troupe/actors/peer_events.hpp"

#include <cstdio>

#include "troupe/tensors/error.hpp"

namespace troupe {

peer_events::subscription::~subscription() {
  if (owner_) owner_->unsubscribe(id_);
}

peer_events::subscription& peer_events::subscription::operator=(subscription&& o) noexcept {
  if (this != &o) {
    if (owner_) owner_->unsubscribe(id_);
    owner_ = std::move(o.owner_);
    id_ = o.id_;
  }
  return *this;
}

peer_events::peer_events(std::string self, connector connect)
    : self_(std::move(self)), connect_(std::move(connect)),
      store_lost_future_(store_lost_promise_.get_future().share()) {}

peer_events::subscription peer_events::subscribe(const std::shared_ptr<peer_events>& events, listener l) {
  if (!events) throw error(errc::invalid_state, "peer_events::subscribe: no node");
  std::lock_guard<std::mutex> lock(events->mu_);
  const auto id = events->next_id_++;
  events->listeners_.emplace(id, std::move(l));
  return subscription(events, id);
}

void peer_events::unsubscribe(std::uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  listeners_.erase(id);
}

void peer_events::watch(const std::vector<std::string>& workers, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(connect_mu_);
  if (!connect_) throw error(errc::invalid_state, "worker " + self_ + " is shut down: cannot watch its peers");
  for (const auto& w : workers)
    if (w != self_) connect_(w, timeout);
}

std::string peer_events::store_host() const {
  std::lock_guard<std::mutex> lock(mu_);
  return store_host_;
}

void peer_events::set_store_host(std::string worker) {
  std::lock_guard<std::mutex> lock(mu_);
  store_host_ = std::move(worker);
}

void peer_events::notify(peer_loss loss) {
  std::lock_guard<std::mutex> lock(mu_);
  loss.store_host = !store_host_.empty() && loss.worker == store_host_;
  for (auto& [id, l] : listeners_) {
    try {
      l(loss);
    } catch (const std::exception& e) {  // a listener's failure must not stop the others
      std::fprintf(stderr, "[troupe] %s: a peer-loss listener threw: %s\n", self_.c_str(), e.what());
    }
  }
  if (loss.store_host && !store_lost_) {
    store_lost_ = true;
    store_lost_promise_.set_value(loss);
  }
}

void peer_events::detach() {
  std::lock_guard<std::mutex> lock(connect_mu_);
  connect_ = nullptr;
}

}  // namespace troupe
