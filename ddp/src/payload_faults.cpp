// Faults on collective payloads (Note [collective payload faults] in payload_faults.hpp).
#include "payload_faults.hpp"

#include "troupe/tensors/error.hpp"

namespace troupe::ddp::detail {

payload_faults::payload_faults(hook_fn hook, std::string group, int rank) : hook_(std::move(hook)), group_(std::move(group)), rank_(rank) {}

payload_faults::fate payload_faults::apply(const std::string& op, std::uint32_t seq, const std::string& note) {
  envelope msg;
  msg.kind = message_kind::collective_payload;
  msg.from = "rank " + std::to_string(rank_);
  msg.to = group_;
  msg.call_id = seq;
  msg.function = op;
  msg.payload.assign(note.begin(), note.end());
  const transport_decision d = hook_(msg);
  if (d.copies == 0) return fate::drop;
  if (d.delay.count() > 0) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, d.delay, [this] { return stopped_; });
  }
  return d.copies > 1 ? fate::repeat : fate::deliver;
}

troupe::error payload_faults::dropped(const std::string& op, std::uint32_t seq) const {
  return troupe::error(errc::io_error, "the fault plan dropped rank " + std::to_string(rank_) + "'s payload of " + op + " #" +
                                           std::to_string(seq) + " in process_group '" + group_ + "'");
}

void payload_faults::stop() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  cv_.notify_all();
}

}  // namespace troupe::ddp::detail
