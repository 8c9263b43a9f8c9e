// The call interceptor of distributed autograd (Note [dist autograd recording] in container.hpp).
#include <tuple>

#include "container_impl.hpp"
#include "troupe/actors/rpc/codec.hpp"
#include "troupe/autograd/autograd_meta.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::dist_autograd {

namespace {

/// The meta bytes of one message: context id, message id (0: nothing recorded), sender, and one
/// requires-grad flag per tensor of the payload, in codec order.
using wire_meta = std::tuple<std::uint64_t, std::uint64_t, std::string, std::vector<std::uint8_t>>;

/// One message exchange seen by distributed autograd. It is a call on the caller (`serving`
/// false) or a served call on the callee (`serving` true: the caller's context is current while
/// it runs).
class exchange_scope final : public rpc::call_scope {
 public:
  exchange_scope(std::shared_ptr<container::impl> c, std::shared_ptr<context_state> ctx, std::string peer, bool serving)
      : c_(std::move(c)), ctx_(std::move(ctx)), peer_(std::move(peer)), serving_(serving) {}

  // A call whose response was never decoded (it failed, or its future was dropped) cannot bring
  // gradients back for what it sent. So its send function goes, and FAST mode does not wait for it.
  ~exchange_scope() override {
    if (serving_ || sent_ == 0 || answered_) return;
    std::lock_guard<std::mutex> lock(ctx_->m);
    ctx_->sends.erase(sent_);
  }
  exchange_scope(const exchange_scope&) = delete;
  exchange_scope& operator=(const exchange_scope&) = delete;

  void on_tensor_written(const tensor& t) override { written_.push_back(t); }

  std::vector<char> take_meta() override {
    std::vector<std::uint8_t> flags;
    bool any = false;
    for (const auto& t : written_) {
      flags.push_back(t.requires_grad() ? 1 : 0);
      any = any || flags.back();
    }
    // A request always carries the context (the callee adopts it); a response only when it
    // carries something to record.
    if (!any && serving_) return {};
    const message_id msg = any ? c_->record_send(*ctx_, written_, peer_) : 0;
    sent_ = msg;
    if (!any) {
      std::lock_guard<std::mutex> lock(ctx_->m);
      ctx_->workers.insert(peer_);
    }
    written_.clear();
    return rpc::encode_result<wire_meta>(wire_meta{ctx_->id, msg, c_->n.info().name, any ? flags : decltype(flags){}});
  }

  void on_meta(const std::vector<char>& meta) override {
    answered_ = true;
    if (meta.empty()) return;
    adopt(rpc::decode_result<wire_meta>(meta, "dist_autograd meta"));
  }

  /// Records the recv function of a message whose meta is `m`.
  void adopt(const wire_meta& m) {
    const auto& [id, msg, sender, flags] = m;
    if (id != ctx_->id)
      throw error(errc::protocol_violation, "dist_autograd: a response from " + sender + " names context " +
                                                std::to_string(id) + ", the call was made in " + std::to_string(ctx_->id));
    flags_ = flags;
    read_ = 0;
    if (msg != 0) recv_ = c_->record_recv(*ctx_, msg, sender, static_cast<std::uint32_t>(flags_.size()));
  }

  tensor on_tensor_read(tensor t) override {
    answered_ = true;
    const std::size_t i = read_++;
    if (!recv_ || i >= flags_.size() || !flags_[i] || !t.defined() || !is_floating(t.dtype())) return t;
    tensor r = t.detach();
    auto& meta = materialize_meta(r);
    meta.grad_fn = recv_;
    meta.output_nr = static_cast<std::uint32_t>(i);
    return r;
  }

  void enter() override {
    if (!serving_) return;
    saved_.push_back(current_slot());
    current_slot() = {c_.get(), ctx_->id};
  }

  void leave() override {
    if (!serving_ || saved_.empty()) return;
    current_slot() = saved_.back();
    saved_.pop_back();
  }

 private:
  std::shared_ptr<container::impl> c_;
  std::shared_ptr<context_state> ctx_;
  std::string peer_;
  bool serving_;
  tensor_list written_;
  std::vector<std::uint8_t> flags_;
  std::size_t read_ = 0;
  std::shared_ptr<recv_function> recv_;
  std::vector<current_context_slot> saved_;
  message_id sent_ = 0;    ///< the send function this call recorded (caller side)
  bool answered_ = false;  ///< the response was decoded
};

class recorder final : public rpc::call_interceptor {
 public:
  explicit recorder(std::weak_ptr<container::impl> c) : c_(std::move(c)) {}

  std::shared_ptr<rpc::call_scope> begin_call(const std::string& to, const std::string& /*function*/) override {
    auto c = c_.lock();
    const auto& slot = current_slot();
    if (!c || slot.owner != c.get() || slot.id == 0) return nullptr;
    auto ctx = c->find_if(slot.id);
    if (!ctx) return nullptr;
    return std::make_shared<exchange_scope>(std::move(c), std::move(ctx), to, false);
  }

  std::shared_ptr<rpc::call_scope> begin_serve(const std::string& from, const std::string& /*function*/,
                                               const std::vector<char>& meta) override {
    auto c = c_.lock();
    if (!c || meta.empty()) return nullptr;
    const auto m = rpc::decode_result<wire_meta>(meta, "dist_autograd meta from " + from);
    auto ctx = c->find_or_create(std::get<0>(m));
    if (!ctx) return nullptr;  // released here already: a late message does not recreate it
    {
      std::lock_guard<std::mutex> lock(ctx->m);
      ctx->workers.insert(from);
    }
    auto scope = std::make_shared<exchange_scope>(std::move(c), std::move(ctx), from, true);
    scope->adopt(m);
    return scope;
  }

 private:
  std::weak_ptr<container::impl> c_;
};

}  // namespace

std::shared_ptr<rpc::call_interceptor> make_recorder(std::weak_ptr<container::impl> c) {
  return std::make_shared<recorder>(std::move(c));
}

}  // namespace troupe::dist_autograd
