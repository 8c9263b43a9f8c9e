// Remote actor frames on the direct channel (rpc/actor_frame_carrier.hpp).
#include "rpc/actor_frame_carrier.hpp"

#include "rpc/wire.hpp"

namespace troupe::detail {

actor_frame_carrier::actor_frame_carrier(std::string me, std::shared_ptr<transport_hook> hook, frame_sender& sender,
                                         frame_sender::later_fn later, std::function<void()> wake_io, std::uint32_t max_body)
    : me_(std::move(me)), hook_(std::move(hook)), sender_(sender), later_(std::move(later)), wake_io_(std::move(wake_io)), max_body_(max_body) {}

void actor_frame_carrier::mark(channel_conn& c) {
  if (!c.actor_traffic.exchange(true, std::memory_order_acq_rel)) wake_io_();  // the I/O thread polls it from now on
}

void actor_frame_carrier::send(const std::shared_ptr<channel_conn>& c, std::vector<char> frame, bool control, std::string type) {
  if (frame.size() < frame_header_size || frame.size() - frame_header_size > max_body_) return;  // forward() refused it
  put_frame_header(frame.data(), frame.size() - frame_header_size, control ? frame_kind::actor_control : frame_kind::actor);
  mark(*c);
  transport_decision d;
  if (hook_ && !control) {
    envelope env{message_kind::actor_message, me_, c->peer, 0, std::move(type), std::move(frame), {}};
    d = hook_->on_send(env);
    frame = std::move(env.payload);
  }
  sender_.send_copies(c, std::move(frame), d);
}

void actor_frame_carrier::on_frame(const std::shared_ptr<channel_conn>& c, bool control, const char* body, std::size_t n) {
  auto sink = sink_.lock();
  if (!sink) return;
  mark(*c);
  if (!hook_ || control) return sink->on_actor_frame(c, control, body, n);
  envelope env{message_kind::actor_message, c->peer, me_, 0, {}, std::vector<char>(body, body + n), {}};
  const auto d = hook_->on_receive(env);
  auto deliver = [weak = std::weak_ptr<actor_frame_sink>(sink), c, bytes = std::move(env.payload), copies = d.copies] {
    auto s = weak.lock();
    for (int i = 0; s && i < copies; ++i) s->on_actor_frame(c, false, bytes.data(), bytes.size());
  };
  if (d.copies <= 0) return;
  if (d.delay.count() > 0) later_(d.delay, std::move(deliver));
  else deliver();
}

void actor_frame_carrier::lost(const std::shared_ptr<channel_conn>& c, const std::string& why) {
  if (auto sink = sink_.lock()) sink->on_conn_lost(c, why);
}

}  // namespace troupe::detail
