// Remote actors over the direct channel (Note [remote actors] in remote/remote_actors.hpp).
#include "remote/remote_actors.hpp"

#include <caf/actor_cast.hpp>
#include <caf/actor_registry.hpp>
#include <caf/atom.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/exit_reason.hpp>
#include <caf/make_actor.hpp>
#include <caf/sec.hpp>

#include <cstdio>
#include <optional>

#include "bounded_deserializer.hpp"
#include "remote/remote_proxy.hpp"
#include "rpc/bulk.hpp"
#include "rpc/device_scope.hpp"
#include "rpc/direct_channel.hpp"
#include "rpc/wire.hpp"
#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/remote_actor.hpp"
#include "troupe/actors/rpc/device_map.hpp"

namespace troupe::detail {

namespace {
// CAF's serialization context (the system, our proxy registry) and the codec context of the
// message being written (Note [codec context]); built on the stack per message.
class codec_unit final : public caf::scoped_execution_unit {
 public:
  codec_unit(caf::scoped_execution_unit& base, const rpc::codec_context& codec)
      : caf::scoped_execution_unit(&base.system()), codec_(codec) {
    proxy_registry_ptr(base.proxy_registry_ptr());
  }
  const rpc::codec_context& codec() const { return codec_; }
  /// The first failure a tensor's inspect noted (see note_actor_codec_failure).
  const std::optional<error>& failure() const { return failure_; }
  void fail(const error& e) {
    if (!failure_) failure_ = e;
  }

 private:
  const rpc::codec_context& codec_;
  std::optional<error> failure_;
};
}  // namespace

void note_actor_codec_failure(caf::execution_unit* unit, const error& e) {
  if (auto* u = dynamic_cast<codec_unit*>(unit)) u->fail(e);
}

const rpc::codec_context& actor_codec_context(caf::execution_unit* unit) {
  const auto* u = dynamic_cast<const codec_unit*>(unit);
  return u ? u->codec() : rpc::plain_context;
}

remote_actors::remote_actors(caf::actor_system& sys, worker_info me, std::shared_ptr<direct_channel> channel, std::shared_ptr<bulk_names> bulk,
                             const rpc::device_maps& maps, resolver resolve)
    : sys_(sys),
      me_(std::move(me)),
      channel_(std::move(channel)),
      bulk_(std::move(bulk)),
      maps_(maps),
      resolve_(std::move(resolve)),
      ctx_(&sys),
      proxies_(sys, *this) {
  ctx_.proxy_registry_ptr(&proxies_);
}

remote_actors::~remote_actors() { shutdown(); }

void remote_actors::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    down_ = true;
    peers_.clear();
    watched_.clear();
  }
  proxies_.clear();
}

std::string remote_actors::worker_of(const caf::node_id& node) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = peers_.find(node);
  return it != peers_.end() ? it->second.name : caf::to_string(node);
}

std::shared_ptr<channel_conn> remote_actors::conn_to(const caf::node_id& node) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = peers_.find(node);
  if (it == peers_.end()) return nullptr;
  return it->second.conn->closed() ? nullptr : it->second.conn;
}

// The first connection a peer's actor frames use stays its channel until it closes.
void remote_actors::adopt(const std::shared_ptr<channel_conn>& c) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (down_) return;
  auto& e = peers_[c->peer_node];
  if (!e.conn || e.conn->closed()) e = peer_entry{c, c->peer};
}

caf::strong_actor_ptr remote_actors::proxy_for(const std::string& worker, caf::actor_id id, std::chrono::milliseconds timeout) {
  if (worker == me_.name) return sys_.registry().get(id);
  auto p = resolve_(worker, timeout);
  if (!p.conn) throw error(errc::invalid_state, me_.name + ": no direct connection to worker " + worker + " for remote actors");
  adopt(p.conn);
  return proxies_.get_or_put(p.node, id);
}

caf::strong_actor_ptr remote_actors::make_proxy(caf::node_id nid, caf::actor_id aid) {
  caf::actor_config cfg;
  auto res = caf::make_actor<remote_proxy, caf::strong_actor_ptr>(aid, nid, &sys_, cfg, weak_from_this());
  send_control(nid, control_op::watch, aid, caf::error{});
  return res;
}

void remote_actors::bounce(const caf::strong_actor_ptr& sender, caf::message_id mid, const caf::error& err) {
  if (!sender || !mid.is_request()) return;
  sender->enqueue(nullptr, mid.response_id(), caf::make_message(err), nullptr);
}

void remote_actors::forward(const caf::node_id& to, caf::strong_actor_ptr sender, caf::actor_id dest, caf::message_id mid, caf::message content) {
  auto c = conn_to(to);
  if (!c) {
    bounce(sender, mid, to_caf_error(errc::peer_lost, me_.name + ": no connection to the node of actor " + std::to_string(dest) + " (" + worker_of(to) + ")"));
    return;
  }
  caf::actor_id from = 0;  // a sender of another node travels anonymously (see the note)
  if (sender && sender->node() == sys_.node()) {
    sys_.registry().put(sender->id(), sender);  // its replies find it by id
    from = sender->id();
  }
  std::vector<char> frame(frame_header_size);
  caf::error err;
  {
    // Tensors go the way of `to` (Note [codec context]). CUDA tensors follow the note's device
    // rules: a response keeps its devices; anything else takes this node's map for the peer.
    const rpc::detail::device_scope requested(maps_, c->peer, false), answering;
    rpc::codec_context codec;
    codec.bulk = bulk_.get();
    codec.shm = same_host(to, sys_.node());
    codec.peer = &to;
    codec.devices = mid.is_response() ? &answering : &requested;
    codec_unit unit(ctx_, codec);
    caf::binary_serializer sink{&unit, frame};
    std::uint64_t m = mid.integer_value();
    for (std::size_t i = 0; i < content.size() && !err; ++i)  // CAF would write a truncated message
      if (sys_.types().portable_name(content.type(i)) == sys_.types().default_type_name())
        err = to_caf_error(errc::bad_argument, "element " + std::to_string(i) + " of the message has a type that is not announced (add_actor_message_type)");
    if (!err) err = sink(from, dest, m, content);
    if (const auto& failed = unit.failure()) err = to_caf_error(*failed);  // CAF may have dropped it
  }
  if (err) {
    const std::string what = me_.name + ": cannot serialize a message to actor " + std::to_string(dest) + " on " + c->peer + ": ";
    const errc code = err.category() == troupe_error_atom::value ? from_caf_error(err, "").code() : errc::bad_argument;
    const std::string why = err.category() == troupe_error_atom::value ? from_caf_error(err, "").message() : sys_.render(err);
    const auto failure = to_caf_error(code == errc::device_mismatch ? code : errc::bad_argument, what + why);
    if (mid.is_response() && !content.match_elements<caf::error>()) {  // the requester gets the error instead
      forward(to, std::move(sender), dest, mid, caf::make_message(failure));
      return;
    }
    if (!mid.is_request()) std::fprintf(stderr, "[troupe] %s%s (the message is dropped)\n", what.c_str(), why.c_str());
    bounce(sender, mid, failure);
    return;
  }
  if (frame.size() - frame_header_size > channel_->max_body()) {  // the peer would drop the connection
    bounce(sender, mid, to_caf_error(errc::bad_argument, me_.name + ": a message to actor " + std::to_string(dest) + " on " + c->peer + " has " +
                                                             std::to_string(frame.size() - frame_header_size) + " bytes, more than max_message_bytes (" +
                                                             std::to_string(channel_->max_body()) + ")"));
    return;
  }
  std::string type = "actor:";  // Note [fault plan]: rules match actor messages by their type names
  for (std::size_t i = 0; i < content.size(); ++i) type += (i == 0 ? "" : ",") + sys_.types().portable_name(content.type(i));
  channel_->send_actor(c, std::move(frame), false, std::move(type));
}

void remote_actors::forward_later(const caf::node_id& to, caf::actor_id dest, caf::message content) {
  channel_->post([weak = weak_from_this(), to, dest, content = std::move(content)]() mutable {
    if (auto self = weak.lock()) self->forward(to, nullptr, dest, caf::make_message_id(), std::move(content));
  });
}

void remote_actors::send_control(const caf::node_id& to, control_op op, caf::actor_id id, caf::error reason) {
  auto c = conn_to(to);
  if (!c) return;
  std::vector<char> frame(frame_header_size);
  caf::binary_serializer sink{&ctx_, frame};
  auto o = static_cast<std::uint8_t>(op);
  if (sink(o, id, reason)) return;
  channel_->send_actor(c, std::move(frame), true);
}

void remote_actors::on_actor_frame(const std::shared_ptr<channel_conn>& c, bool control, const char* body, std::size_t n) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (down_) return;
  }
  adopt(c);
  if (control) on_control(c, body, n);
  else on_message(c, body, n);
}

bool read_message_head(bounded_deserializer& src, actor_message_head& head) {
  try {
    return !src(head.from, head.dest, head.mid);
  } catch (const std::exception&) {  // CAF's loaders may throw on bad input
    return false;
  }
}

std::string read_message_content(caf::actor_system& sys, bounded_deserializer& src, caf::message& content) {
  try {
    if (auto err = src(content)) return sys.render(err);
  } catch (const std::exception& e) {  // CAF's variant loader throws on an unknown type index (config_value)
    return std::string("undecodable content: ") + e.what();
  }
  return src.remaining() == 0 ? std::string() : std::string("trailing bytes");
}

bool read_control_frame(bounded_deserializer& src, actor_control_frame& frame) {
  try {
    return !src(frame.op, frame.id, frame.reason) && src.remaining() == 0;
  } catch (const std::exception&) {  // a reason's context can hold a config_value whose loader throws
    return false;
  }
}

void remote_actors::on_message(const std::shared_ptr<channel_conn>& c, const char* body, std::size_t n) {
  // A response's CUDA tensors land by the reverse of this node's map for the peer (see the note).
  rpc::device_map reverse;  // no allocation while no map is set
  if (!maps_.empty()) reverse = rpc::invert_device_map(c->peer, maps_.of(c->peer));
  const rpc::detail::result_devices results(reverse, c->peer);
  rpc::codec_context codec;  // Note [codec context]
  codec.results = &results;
  codec.bulk = bulk_.get();
  codec.shm = same_host(c->peer_node, sys_.node());
  codec.peer = &c->peer_node;
  codec_unit unit(ctx_, codec);
  bounded_deserializer src{&unit, body, n};  // Note [bounded CAF reader]
  actor_message_head head;
  if (!read_message_head(src, head)) {
    std::fprintf(stderr, "[troupe] %s: dropped a malformed actor message from %s\n", me_.name.c_str(), c->peer.c_str());
    return;
  }
  const auto from_id = head.from, dest_id = head.dest;
  const auto mid = caf::make_message_id(head.mid);
  caf::strong_actor_ptr from = from_id != 0 ? proxies_.get_or_put(c->peer_node, from_id) : nullptr;
  auto dst = sys_.registry().get(dest_id);
  if (!dst) {  // exited or never here: fail a request at once, and its proxy goes down
    bounce(from, mid, caf::make_error(caf::sec::request_receiver_down, "actor " + std::to_string(dest_id) + " on worker " + me_.name + " is not running (it exited or never existed)"));
    send_control(c->peer_node, control_op::down, dest_id, caf::exit_reason::unknown);
    return;
  }
  caf::message content;
  auto why = read_message_content(sys_, src, content);
  const auto& failed = unit.failure();  // CAF may have dropped a tensor's error (see the note)
  if (failed) why = failed->message();
  if (!why.empty()) {
    std::fprintf(stderr, "[troupe] %s: cannot decode an actor message from %s: %s\n", me_.name.c_str(), c->peer.c_str(), why.c_str());
    const errc code = failed && failed->code() == errc::device_mismatch ? errc::device_mismatch : errc::protocol_violation;
    const auto err = to_caf_error(code, "worker " + me_.name + " cannot decode a message for actor " + std::to_string(dest_id) + " from " + c->peer + ": " + why +
                                            (failed ? "" : " (is every type in it announced with add_actor_message_type on both sides?)"));
    if (mid.is_response()) dst->enqueue(caf::make_mailbox_element(std::move(from), mid, {}, caf::make_message(err)), nullptr);  // the request fails at once
    else bounce(from, mid, err);
    return;
  }
  if (intercept_link(dst, content)) return;
  if (mid.is_response() && from)
    if (auto* p = dynamic_cast<remote_proxy*>(caf::actor_cast<caf::abstract_actor*>(from))) p->answered(dest_id, mid);
  dst->enqueue(caf::make_mailbox_element(std::move(from), mid, {}, std::move(content)), nullptr);
}

// A proxy's add_backlink arrives as (link_atom, linker): link the linker's proxy here with the
// actor, as CAF's BASP does.
bool remote_actors::intercept_link(const caf::strong_actor_ptr& dst, caf::message& content) {
  if (!content.match_elements<caf::atom_value, caf::strong_actor_ptr>()) return false;
  const auto a = content.get_as<caf::atom_value>(0);
  const bool link = a == caf::link_atom::value;
  if (!link && a != caf::unlink_atom::value) return false;
  const auto& ptr = content.get_as<caf::strong_actor_ptr>(1);
  if (!ptr || ptr->node() == sys_.node()) return true;
  auto* proxy = static_cast<caf::actor_proxy*>(ptr->get());
  if (link) proxy->add_link(dst->get());
  else proxy->remove_link(dst->get());
  return true;
}

void remote_actors::on_control(const std::shared_ptr<channel_conn>& c, const char* body, std::size_t n) {
  bounded_deserializer src{&ctx_, body, n};  // Note [bounded CAF reader]
  actor_control_frame f;
  if (!read_control_frame(src, f)) {
    std::fprintf(stderr, "[troupe] %s: dropped a malformed actor control frame from %s\n", me_.name.c_str(), c->peer.c_str());
    return;
  }
  if (f.op == static_cast<std::uint8_t>(control_op::watch)) watch(c, f.id);
  else if (f.op == static_cast<std::uint8_t>(control_op::down)) proxies_.erase(c->peer_node, f.id, std::move(f.reason));
}

void remote_actors::watch(const std::shared_ptr<channel_conn>& c, caf::actor_id id) {
  auto a = sys_.registry().get(id);
  if (!a) {
    send_control(c->peer_node, control_op::down, id, caf::exit_reason::unknown);
    return;
  }
  auto key = std::make_pair(id, c->peer_node);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!watched_.insert(key).second) return;
  }
  a->get()->attach_functor([weak = weak_from_this(), key](const caf::error& reason) {
    auto self = weak.lock();
    if (!self) return;
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      if (self->watched_.erase(key) == 0) return;  // that peer is gone
    }
    self->send_control(key.second, control_op::down, key.first, reason);
  });
}

void remote_actors::on_conn_lost(const std::shared_ptr<channel_conn>& c, const std::string& why) {
  const auto node = c->peer_node;
  std::string name = c->peer;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (down_) return;
    auto it = peers_.find(node);
    if (it != peers_.end() && it->second.conn != c && !it->second.conn->closed()) return;  // not its channel
    if (it != peers_.end()) {
      name = it->second.name;
      peers_.erase(it);
    }
    std::erase_if(watched_, [&](const auto& k) { return k.second == node; });
  }
  const auto reason = to_caf_error(errc::peer_lost, "worker " + name + " was lost (" + why + ")");
  for (auto& p : proxies_.get_all(node)) proxies_.erase(node, p->id(), reason);
}

}  // namespace troupe::detail
