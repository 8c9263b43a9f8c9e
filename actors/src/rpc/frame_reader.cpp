// Reading and routing a direct channel connection's frames (Note [frame routing] in
// rpc/frame_reader.hpp).
#include "rpc/frame_reader.hpp"

#include <cstdio>

#include "rpc/byte_pool.hpp"
#include "rpc/split_frame.hpp"
#include "rpc/wire.hpp"

namespace troupe::detail {

frame_reader::frame_reader(const direct_channel_config& cfg, channel_listener& listener, call_server& server, call_client& client,
                           actor_frame_carrier& actors, std::uint32_t max_body, drop_fn drop, admit_fn admit)
    : cfg_(cfg), listener_(listener), server_(server), client_(client), actors_(actors), max_body_(max_body), drop_(std::move(drop)),
      admit_(std::move(admit)) {}

bool frame_reader::read(const std::shared_ptr<channel_conn>& c, led_jobs* jobs, bool block_first) {
  const std::uint64_t before = c->bytes_read.load(std::memory_order_relaxed);
  // Note [connection hygiene]: before its auth frame, a connection is read one frame's worth.
  const auto budget = [&] { return c->outgoing() || c->authed ? max_read_bytes : frame_header_size + max_auth_body; };
  bool open = c->read_available(block_first, budget());
  for (;;) {
    // Note [direct fragment data]: a fragment read straight into its stream comes before the
    // bytes read after it.
    if (c->streams.direct_done()) {
      fragment_streams::assembled a;
      if (c->streams.finish_direct(a) == fragment_streams::result::complete && !on_assembled(c, std::move(a), jobs)) {
        if (!c->closed()) drop_malformed(c);
        return false;
      }
    }
    if (!parse_frames(c, jobs)) return false;
    // Read on while a fragment's data goes straight into its stream and the budget of one round
    // (max_read_bytes, Note [fragments]) is not used up.
    if (!open || !c->more_to_read || c->bytes_read.load(std::memory_order_relaxed) - before >= max_read_bytes) break;
    open = c->read_available(false, budget());
  }
  if (!open) {
    drop_(c, "connection closed");
    return false;
  }
  return true;
}

bool frame_reader::parse_frames(const std::shared_ptr<channel_conn>& c, led_jobs* jobs) {
  std::size_t at = 0;
  auto& in = c->in;
  while (in.size() - at >= frame_header_size) {
    const std::uint32_t len = frame_length(in.data() + at);
    // Before its ticket, a connection may send one small auth frame and nothing else: judge the
    // header at once rather than wait for a body a scanner announced.
    const bool unauthenticated = !c->outgoing() && !c->authed;
    if (len > (unauthenticated ? max_auth_body : max_body_) ||
        (unauthenticated && in[at + 4] != static_cast<char>(frame_kind::auth))) {
      std::fprintf(stderr, "[troupe] %s: dropped a direct rpc connection: bad frame header\n", cfg_.me.name.c_str());
      drop_(c, "protocol violation: bad frame header");
      return false;
    }
    const auto kind = static_cast<std::uint8_t>(in[at + 4]);
    const std::size_t have = in.size() - at - frame_header_size;
    if (have < len) {
      // Note [direct fragment data]: a later fragment's data straight into its stream, a large
      // request's or response's payload straight into its buffer.
      const auto want = static_cast<std::uint8_t>(c->outgoing() ? frame_kind::response : frame_kind::request);
      const bool fragment = kind == static_cast<std::uint8_t>(frame_kind::fragment) && have >= fragment_head_size;
      const bool large = kind == want && len >= split_payload_bytes;
      if ((fragment || large) && c->streams.direct_left() == 0) {
        const char* body = in.data() + at + frame_header_size;
        const auto r = fragment ? c->streams.start_direct(body, have, len, want, max_body_)
                                : c->streams.start_frame(body, have, len, want, cfg_.bulk ? &cfg_.bulk->buffers() : nullptr);
        if (r == fragment_streams::result::malformed) {
          drop_malformed(c);
          return false;
        }
        if (r == fragment_streams::result::partial) {
          at = in.size();
          break;
        }
      }
      // A large frame arriving in pieces gets room for all of it now. Doubling step by step
      // would copy what came so far each time. read_available then fills it in large reads.
      if (in.capacity() < at + frame_header_size + len) in.reserve(at + frame_header_size + len);
      break;
    }
    if (!handle_frame(c, kind, in.data() + at + frame_header_size, len, jobs)) return false;
    at += frame_header_size + len;
  }
  in.erase(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(at));
  return true;
}

void frame_reader::drop_malformed(const std::shared_ptr<channel_conn>& c) {
  std::fprintf(stderr, "[troupe] %s: dropped the direct rpc connection of %s: malformed frame\n", cfg_.me.name.c_str(), c->peer.c_str());
  drop_(c, "protocol violation: malformed frame");
}

bool frame_reader::on_auth(const std::shared_ptr<channel_conn>& c, const char* body, std::size_t n) {
  channel_auth a;
  channel_listener::ticket t;
  if (!parse_body(body, n, a) || !listener_.redeem(a.secret, a.name, t)) {
    std::fprintf(stderr, "[troupe] %s: refused a direct rpc connection: no valid ticket\n", cfg_.me.name.c_str());
    drop_(c, "unauthenticated");
    return false;
  }
  admit_(*c, std::move(t), a.shm_ok);
  c->authed = true;
  return true;
}

bool frame_reader::handle_frame(const std::shared_ptr<channel_conn>& c, std::uint8_t kind, const char* body, std::size_t n, led_jobs* jobs) {
  if (!c->outgoing() && !c->authed) {
    if (kind == static_cast<std::uint8_t>(frame_kind::auth)) return on_auth(c, body, n);
    std::fprintf(stderr, "[troupe] %s: refused a direct rpc connection that did not authenticate first\n", cfg_.me.name.c_str());
    drop_(c, "unauthenticated");
    return false;
  }
  if (kind == static_cast<std::uint8_t>(frame_kind::actor) || kind == static_cast<std::uint8_t>(frame_kind::actor_control)) {
    actors_.on_frame(c, kind == static_cast<std::uint8_t>(frame_kind::actor_control), body, n);  // Note [remote actors]
    return true;
  }
  if (kind == static_cast<std::uint8_t>(frame_kind::fragment)) {
    if (on_fragment(c, body, n, jobs)) return true;
    if (c->closed()) return false;  // dropped for the inner frame, which said why
  } else if (!c->outgoing() && kind == static_cast<std::uint8_t>(frame_kind::request)) {
    rpc_request req;
    if (n >= byte_pool_min_bytes && cfg_.bulk) cfg_.bulk->buffers().reserve(req.payload, n);  // Note [byte pool]
    if (n >= split_payload_bytes ? parse_split_body(body, n, req) : parse_body(body, n, req)) {
      server_.on_request(c, std::move(req), jobs);
      return true;
    }
  } else if (c->outgoing() && kind == static_cast<std::uint8_t>(frame_kind::response)) {
    rpc_response resp;
    if (n >= byte_pool_min_bytes && cfg_.bulk) cfg_.bulk->buffers().reserve(resp.payload, n);  // Note [byte pool]
    if (n >= split_payload_bytes ? parse_split_body(body, n, resp) : parse_body(body, n, resp)) {
      client_.on_response(c, std::move(resp));
      return true;
    }
  }
  drop_malformed(c);
  return false;
}

bool frame_reader::on_fragment(const std::shared_ptr<channel_conn>& c, const char* body, std::size_t n, led_jobs* jobs) {
  const auto want = static_cast<std::uint8_t>(c->outgoing() ? frame_kind::response : frame_kind::request);
  fragment_streams::assembled a;
  switch (c->streams.add(body, n, want, cfg_.bulk ? &cfg_.bulk->buffers() : nullptr, a, max_body_)) {
    case fragment_streams::result::partial:
      return true;
    case fragment_streams::result::complete:
      return on_assembled(c, std::move(a), jobs);
    default:
      return false;
  }
}

bool frame_reader::on_assembled(const std::shared_ptr<channel_conn>& c, fragment_streams::assembled&& a, led_jobs* jobs) {
  if (a.head.empty()) {  // the whole body in one buffer
    const bool ok = handle_frame(c, a.inner, a.rest.data(), a.rest.size(), jobs);
    if (cfg_.bulk) cfg_.bulk->buffers().give(std::move(a.rest));
    return ok;
  }
  // The buffer the fragments were put together in becomes the payload (no copy).
  if (a.inner == static_cast<std::uint8_t>(frame_kind::request)) {
    rpc_request req;
    if (!parse_split_parts(a.head, std::move(a.rest), req)) return false;
    server_.on_request(c, std::move(req), jobs);
  } else {
    rpc_response resp;
    if (!parse_split_parts(a.head, std::move(a.rest), resp)) return false;
    client_.on_response(c, std::move(resp));
  }
  return true;
}

}  // namespace troupe::detail
