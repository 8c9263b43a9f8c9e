// Writing the direct channel's frames (rpc/frame_sender.hpp) and the reply batch (Note [reply
// batch] in troupe/actors/rpc/reply_batch.hpp).
#include "rpc/frame_sender.hpp"

#include <algorithm>
#include <utility>

#include "rpc/bulk.hpp"
#include "rpc/split_frame.hpp"
#include "troupe/actors/rpc/reply_batch.hpp"

namespace troupe::rpc {

// Note [reply batch]: the frames a batch holds, per connection in first-use order.
struct reply_batch::frames {
  std::vector<std::pair<std::shared_ptr<troupe::detail::channel_conn>, std::vector<char>>> per_conn;
};

reply_batch::reply_batch() = default;

reply_batch::~reply_batch() {
  if (frames_) troupe::detail::frame_sender::flush(*this);
}

}  // namespace troupe::rpc

namespace troupe::detail {

namespace {

// Whether a frame on `c` is a response that `batch` holds.
bool held(const rpc::reply_batch* batch, const channel_conn& c) { return batch && !c.outgoing(); }

// This thread's buffer for the small frame it is about to send, emptied.
std::vector<char>& scratch_frame() {
  thread_local std::vector<char> frame;
  frame.clear();
  return frame;
}

}  // namespace

void frame_sender::flush(rpc::reply_batch& batch) {
  auto held = std::exchange(batch.frames_->per_conn, {});
  for (auto& [c, bytes] : held) c->write(bytes.data(), bytes.size());  // closed: the I/O thread fails the calls
}

frame_sender::frame_sender(std::shared_ptr<bulk_names> bulk, std::uint32_t max_body, later_fn later)
    : bulk_(std::move(bulk)), max_body_(max_body), later_(std::move(later)) {}

void frame_sender::send_copies(const std::shared_ptr<channel_conn>& c, std::vector<char> frame, const transport_decision& d,
                               rpc::reply_batch* batch) {
  if (d.copies <= 0) return;
  if (held(batch, *c) && d.delay.count() <= 0) {  // a response, held (Note [reply batch])
    if (!batch->frames_) batch->frames_ = std::make_unique<rpc::reply_batch::frames>();
    auto& per = batch->frames_->per_conn;
    auto it = std::find_if(per.begin(), per.end(), [&](const auto& p) { return p.first == c; });
    if (it == per.end()) it = per.insert(per.end(), {c, {}});
    for (int i = 0; i < d.copies; ++i) it->second.insert(it->second.end(), frame.begin(), frame.end());
    return;
  }
  auto send = [c, frame = std::move(frame), copies = d.copies] {
    for (int i = 0; i < copies; ++i)
      if (!c->write(frame.data(), frame.size())) return;  // closed: the I/O thread fails the calls
  };
  if (d.delay.count() > 0) later_(d.delay, std::move(send));
  else send();
}

// Written from the scratch buffer at once in the usual case; copied only when it must be kept
// (held replies, a delay, copies).
void frame_sender::send_frame(const std::shared_ptr<channel_conn>& c, const std::vector<char>& frame, const transport_decision& d,
                              rpc::reply_batch* batch) {
  if (d.copies == 1 && d.delay.count() <= 0 && !held(batch, *c)) {
    c->write(frame.data(), frame.size());  // closed: the I/O thread fails the calls
    return;
  }
  send_copies(c, frame, d, batch);
}

template <class T>
bool frame_sender::send_small(const std::shared_ptr<channel_conn>& c, frame_kind kind, T& m, const transport_decision& d,
                              rpc::reply_batch* batch) {
  auto& frame = scratch_frame();
  if (!append_frame(frame, kind, m)) return false;
  send_frame(c, frame, d, batch);
  return true;
}

bool frame_sender::send(const std::shared_ptr<channel_conn>& c, frame_kind kind, rpc_request& m, const transport_decision& d) {
  return send_small(c, kind, m, d, nullptr);
}

bool frame_sender::send(const std::shared_ptr<channel_conn>& c, frame_kind kind, rpc_response& m, const transport_decision& d,
                        rpc::reply_batch* batch) {
  return send_small(c, kind, m, d, batch);
}

void frame_sender::send_split(const std::shared_ptr<channel_conn>& c, const split_frame& f, const transport_decision& d,
                              rpc::reply_batch* batch) {
  if (d.copies <= 0) return;
  if (held(batch, *c) || d.delay.count() > 0) return send_copies(c, f.flat(), d, batch);  // kept: one buffer
  std::vector<channel_conn::part> parts{{f.head.data(), f.head.size()}};
  f.for_each_payload_piece([&](const char* p, std::size_t n) { parts.push_back({p, n}); });  // Note [borrowed tensor bytes]
  parts.push_back({f.tail.data(), f.tail.size()});
  const bool fragmented = f.size() - frame_header_size >= fragment_min_bytes;  // Note [fragments]
  for (int i = 0; i < d.copies; ++i)
    if (!(fragmented ? c->write_fragmented(parts.data(), parts.size()) : c->write_parts(parts.data(), parts.size())))
      return;  // closed: the I/O thread fails the calls
}

template <class T>
bool frame_sender::send_split_msg(const std::shared_ptr<channel_conn>& c, frame_kind kind, T m, const transport_decision& d,
                                  rpc::reply_batch* batch, rpc::detail::borrowed_parts borrowed) {
  struct large {
    T msg;
    rpc::detail::borrowed_parts borrowed;
    split_frame f;
  };
  auto l = std::make_shared<large>();
  l->msg = std::move(m);
  l->borrowed = std::move(borrowed);
  // l->f points into l->msg and l->borrowed, which stay put.
  if (!make_split_frame(l->f, kind, l->msg, max_body_, &l->borrowed)) return false;
  // Note [borrowed tensor bytes]: a frame that borrows is written before this returns.
  const bool background = l->f.size() - frame_header_size >= fragment_min_bytes && d.copies > 0 && d.delay.count() <= 0 &&
                          !held(batch, *c) && l->borrowed.empty();  // held replies keep one buffer
  // The writer thread holds no reference to the channel: stop() joins it before this goes. A
  // held reply is sent on this thread (`batch` lives on it).
  auto send = [this, c, l, d, batch = background ? nullptr : batch] {
    send_split(c, l->f, d, batch);
    l->borrowed.clear();  // written or copied: the tensors are free
    if (bulk_) bulk_->buffers().give(std::move(l->msg.payload));  // written or copied: Note [byte pool]
  };
  if (background) writer_.post(std::move(send));
  else send();
  return true;
}

bool frame_sender::send_large(const std::shared_ptr<channel_conn>& c, frame_kind kind, rpc_request m, const transport_decision& d,
                              rpc::detail::borrowed_parts borrowed) {
  return send_split_msg(c, kind, std::move(m), d, nullptr, std::move(borrowed));
}

bool frame_sender::send_large(const std::shared_ptr<channel_conn>& c, frame_kind kind, rpc_response m, const transport_decision& d,
                              rpc::reply_batch* batch, rpc::detail::borrowed_parts borrowed) {
  return send_split_msg(c, kind, std::move(m), d, batch, std::move(borrowed));
}

}  // namespace troupe::detail
