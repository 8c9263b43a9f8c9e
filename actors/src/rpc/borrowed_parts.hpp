#pragma once
// Large tensors of a payload that are written to the socket from their own storage.
//
// Note [borrowed tensor bytes]
//
// A large tensor sent as inline bytes is not copied into the payload. Such tensors are kinds 0,
// 3 and 4: between hosts, or without shared memory. The encode leaves its bytes out of the payload
// buffer and records a borrowed part: where in the buffer the bytes belong, and the tensor. The
// frame goes out as a gather of the buffer's pieces and the tensors' bytes (sendmsg, fragments
// included: Note [fragments]). On the wire it is the same frame as with the bytes copied in.
// So the receiver reads it as before (Note [direct fragment data], Note [adopted payload]).
//
//   payload buffer:  [ count | tag | tensor header | pad ][ later arguments ]
//   borrowed part:                                      ^ at, t's nbytes from t's storage
//   on the wire:     frame head | buffer[0, at) | t's bytes | buffer[at, end) | frame tail
//
// Value semantics hold. A frame with borrowed parts is written on the sending thread, and the
// send returns once the kernel holds every byte of it. The sender may change its tensor after
// that; what was sent stays sent. The parts keep their tensors' storage alive until then and
// release it as the send returns.
//
// Who borrows: the arguments of rpc_sync (node::call with `blocking`). Its caller waits for the
// result right after, so writing the request before call() returns costs it nothing. Small calls
// of other threads still pass the request between fragments (Note [fragments]). rpc_async's
// arguments do not borrow. Such a call would return only once the request is in the kernel.
// Small calls the same thread makes next could then no longer pass it between fragments. A served function's result does not borrow either.
// Borrowing there makes the byte pool's reuse of 64 MB buffers uneven, for a reason not known.
// A fresh buffer comes in about one echo of eight. A payload nested in another (an rref's remote
// call, a stored value) is copied: its buffer is read whole.
// Whatever keeps a frame or hands its payload to someone flattens it first, one copy as before.
// These are a transport hook (the fault plan reads, copies and delays payloads) and a reply
// batch.

#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "troupe/tensors/tensor.hpp"

namespace troupe::rpc::detail {

/// Inline tensors at least this large are borrowed; a smaller copy costs less than the gather.
inline constexpr std::size_t borrow_min_bytes = std::size_t{256} << 10;

/// The borrowed parts of one payload buffer, in buffer order (see the note). Move-only.
class borrowed_parts {
 public:
  struct part {
    std::size_t at = 0;  ///< offset in the payload buffer the bytes go before
    tensor keep;         ///< contiguous CPU; its bytes are the part
  };
  borrowed_parts() = default;
  borrowed_parts(borrowed_parts&&) noexcept = default;
  borrowed_parts& operator=(borrowed_parts&&) noexcept = default;
  borrowed_parts(const borrowed_parts&) = delete;
  borrowed_parts& operator=(const borrowed_parts&) = delete;

  /// Records the bytes of contiguous CPU `t` at offset `at` of the buffer (at least the last one's).
  void add(std::size_t at, tensor t) {
    bytes_ += static_cast<std::size_t>(t.nbytes());
    parts_.push_back(part{at, std::move(t)});
  }
  bool empty() const { return parts_.empty(); }
  /// The bytes borrowed in all: the payload is the buffer's size plus this.
  std::size_t bytes() const { return bytes_; }
  const std::vector<part>& parts() const { return parts_; }
  /// Lets the tensors go.
  void clear() {
    parts_.clear();
    bytes_ = 0;
  }

  /// Calls `piece(data, size)` for the payload's pieces in order: the buffer's and the tensors'.
  template <class F>
  void for_each_piece(const std::vector<char>& buffer, F&& piece) const {
    std::size_t from = 0;
    for (const auto& p : parts_) {
      if (p.at > from) piece(buffer.data() + from, p.at - from);
      piece(static_cast<const char*>(p.keep.data_ptr()), static_cast<std::size_t>(p.keep.nbytes()));
      from = p.at;
    }
    if (buffer.size() > from) piece(buffer.data() + from, buffer.size() - from);
  }

  /// The whole payload in `buffer` (one copy); the parts are then empty.
  void flatten_into(std::vector<char>& buffer) {
    if (parts_.empty()) return;
    std::vector<char> whole;
    whole.reserve(buffer.size() + bytes_);
    for_each_piece(buffer, [&](const char* p, std::size_t n) { whole.insert(whole.end(), p, p + n); });
    buffer.swap(whole);
    clear();
  }

 private:
  std::vector<part> parts_;
  std::size_t bytes_ = 0;
};

}  // namespace troupe::rpc::detail
