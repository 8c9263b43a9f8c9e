#pragma once
/// \file codec_context.hpp
/// The explicit context of one RPC encode or decode (Note [codec context]).

namespace caf {
class node_id;
}  // namespace caf

namespace troupe::detail {
class bulk_names;
}  // namespace troupe::detail

namespace troupe::rpc {

class call_scope;  // interceptor.hpp

namespace detail {
class borrowed_parts;  // src/rpc/borrowed_parts.hpp
class device_scope;  // src/rpc/device_scope.hpp
class payload_keeper;
class result_devices;
}  // namespace detail

/// Note [codec context]
/// What steers an encode or a decode beyond the value itself travels in one codec_context that
/// the caller builds on its stack and hands to the writer or reader; the codec reads nothing
/// else (no thread-local state). Every field is optional (null: the plain behaviour):
///   * keeper: inline tensors of at least adopt_min_bytes read from its buffer view it
///     (Note [adopted payload]);
///   * results: where CUDA results (kind 4) of the peer go back to (Note [rpc device map]);
///   * devices: how CUDA tensors are written to the peer (kinds 3, 4, 5); null: staged as CPU
///     tensors (kind 0);
///   * bulk, shm and peer: the node's segments and byte pool, whether tensors may go over shared
///     memory to `peer` (Note [tensor over shared memory]); the byte pool is used with or without
///     shm (Note [byte pool]);
///   * scope: the interceptor's view of this message (Note [call interceptor]);
///   * gather and borrow: the sender's list of tensors it writes from their storage, and whether
///     this encode may add to it: set only by the encode whose buffer is the message's payload
///     (Note [borrowed tensor bytes] in src/rpc/borrowed_parts.hpp).
/// A nested encode (a payload inside a payload, a served function's own calls) builds its own
/// context, so two nodes of one process encoding on one thread never see each other's settings.
/// A context refers to what its builder owns: it must not outlive them, and it is not copied
/// into anything that outlives the encode or decode.
struct codec_context {
  const detail::payload_keeper* keeper = nullptr;
  const detail::result_devices* results = nullptr;
  const detail::device_scope* devices = nullptr;
  troupe::detail::bulk_names* bulk = nullptr;
  bool shm = false;
  const caf::node_id* peer = nullptr;
  call_scope* scope = nullptr;
  detail::borrowed_parts* gather = nullptr;
  bool borrow = false;
};

/// The context of an encode or decode that nothing steers (values stored, meta bytes, tests).
inline constexpr codec_context plain_context{};

}  // namespace troupe::rpc
