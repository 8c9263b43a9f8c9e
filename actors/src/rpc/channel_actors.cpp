// The direct RPC channel carrying remote actor frames (Note [remote actors] in
// remote/remote_actors.hpp): the hook, delays and copies, and the hand-over to the actor layer.
#include "rpc/direct_channel.hpp"
#include "rpc/wire.hpp"

namespace troupe::detail {

void direct_channel::send_actor(const std::shared_ptr<channel_conn>& c, std::vector<char> frame, bool control, std::string type) {
  if (frame.size() < frame_header_size || frame.size() - frame_header_size > max_body()) return;  // forward() refused it
  put_frame_header(frame.data(), frame.size() - frame_header_size, control ? frame_kind::actor_control : frame_kind::actor);
  if (!c->actor_traffic.exchange(true, std::memory_order_acq_rel)) wake();  // the I/O thread polls it from now on
  transport_decision d;
  if (cfg_.hook && !control) {
    envelope env{message_kind::actor_message, cfg_.me.name, c->peer, 0, std::move(type), std::move(frame), {}};
    d = cfg_.hook->on_send(env);
    frame = std::move(env.payload);
  }
  send_copies(c, std::move(frame), d);
}

void direct_channel::on_actor_frame(const std::shared_ptr<channel_conn>& c, bool control, const char* body, std::size_t n) {
  auto sink = actor_sink_.lock();
  if (!sink) return;
  if (!c->actor_traffic.exchange(true, std::memory_order_acq_rel)) wake();
  if (!cfg_.hook || control) return sink->on_actor_frame(c, control, body, n);
  envelope env{message_kind::actor_message, c->peer, cfg_.me.name, 0, {}, std::vector<char>(body, body + n), {}};
  const auto d = cfg_.hook->on_receive(env);
  auto deliver = [weak = std::weak_ptr<actor_frame_sink>(sink), c, bytes = std::move(env.payload), copies = d.copies] {
    auto s = weak.lock();
    for (int i = 0; s && i < copies; ++i) s->on_actor_frame(c, false, bytes.data(), bytes.size());
  };
  if (d.copies <= 0) return;
  if (d.delay.count() > 0) later(d.delay, std::move(deliver));
  else deliver();
}

void direct_channel::notify_lost(const std::shared_ptr<channel_conn>& c, const std::string& why) {
  if (stopping_) return;
  if (auto sink = actor_sink_.lock()) sink->on_conn_lost(c, why);
}

}  // namespace troupe::detail
