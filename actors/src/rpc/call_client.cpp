// The caller side of the direct channel (rpc/call_client.hpp).
#include "rpc/call_client.hpp"

#include <unistd.h>

#include "rpc/split_frame.hpp"

namespace troupe::detail {

call_client::call_client(direct_channel_config cfg, frame_sender& sender, frame_sender::later_fn later, int wake_fd,
                         std::chrono::milliseconds io_sleep)
    : cfg_(std::move(cfg)), table_(cfg_.bulk), sender_(sender), later_(std::move(later)), wake_fd_(wake_fd), io_sleep_(io_sleep) {}

void call_client::call(const std::shared_ptr<channel_conn>& c, const std::shared_ptr<rpc::detail::call_state>& st,
                       const std::string& function, std::vector<char> payload, std::vector<char> meta, bool stopping,
                       rpc::detail::borrowed_parts borrowed) {
  const std::uint64_t id = stopping ? 0 : table_.add(c, st, function);
  if (id == 0) {
    st->complete(errc::invalid_state, st->what() + ": node " + cfg_.me.name + " shut down", {});
    return;
  }
  if (c->closed()) {  // lost before we could send: fail now rather than at the deadline
    table_.finish(c.get(), id, errc::peer_lost, "worker " + c->peer + " was lost (connection closed) before call to '" + function + "' from " + cfg_.me.name, {}, {});
    return;
  }
  rpc_request req{id, function, cfg_.me.name, std::move(payload), std::move(meta)};
  transport_decision d;
  if (cfg_.hook) {
    borrowed.flatten_into(req.payload);  // the hook sees, keeps and copies whole payloads
    envelope env{message_kind::rpc_request, cfg_.me.name, c->peer, id, function, std::move(req.payload), std::move(req.meta)};
    d = cfg_.hook->on_send(env);
    req.payload = std::move(env.payload);
    req.meta = std::move(env.meta);
  }
  const std::size_t bytes = req.payload.size() + borrowed.bytes();
  if (bytes >= split_payload_bytes) {  // a large payload is not copied into the frame
    wake_if_first_deadline(st->deadline());
    if (sender_.send_large(c, frame_kind::request, std::move(req), d, std::move(borrowed))) return;
    table_.finish(c.get(), id, errc::bad_argument,
           st->what() + ": its arguments (" + std::to_string(bytes) + " bytes encoded) are more than one message carries (" +
               std::to_string(channel_max_body(cfg_)) + " bytes)",
           {}, {});
    return;
  }
  wake_if_first_deadline(st->deadline());
  if (!sender_.send(c, frame_kind::request, req, d))
    table_.finish(c.get(), id, errc::bad_argument, st->what() + ": cannot serialize the request", {}, {});
}

void call_client::wake_if_first_deadline(clock::time_point deadline) {
  // The I/O thread sleeps until the earliest deadline it knew of; an earlier one needs a wake.
  if (deadline < clock::now() + io_sleep_) {
    const std::uint64_t one = 1;
    [[maybe_unused]] auto r = ::write(wake_fd_, &one, sizeof one);
  }
}

void call_client::on_response(const std::shared_ptr<channel_conn>& c, rpc_response resp) {
  if (cfg_.hook) {
    envelope env{message_kind::rpc_response, c->peer, cfg_.me.name, resp.id, {}, std::move(resp.payload), std::move(resp.meta)};
    const auto d = cfg_.hook->on_receive(env);
    if (d.copies <= 0) return;
    resp.payload = std::move(env.payload);
    resp.meta = std::move(env.meta);
    if (d.delay.count() > 0) {
      later_(d.delay, [this, owner = owner_.lock(), c, resp = std::move(resp)]() mutable {
        table_.finish(c.get(), resp.id, static_cast<errc>(resp.code), std::move(resp.message), std::move(resp.payload), std::move(resp.meta));
      });
      return;
    }
  }
  table_.finish(c.get(), resp.id, static_cast<errc>(resp.code), std::move(resp.message), std::move(resp.payload), std::move(resp.meta));
}

}  // namespace troupe::detail
