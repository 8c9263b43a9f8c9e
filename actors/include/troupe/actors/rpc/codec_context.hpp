#pragma once
/// \file codec_context.hpp
/// The explicit context of one RPC encode or decode (Note [codec context]).

#include <string>

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

/// Told before long work on the calling thread: a large copy, a blocking wait. The node's executor
/// implements it (Note [predicted quick] in src/executor.hpp).
class long_work_notice {
 public:
  virtual ~long_work_notice() = default;
  /// Hands the executor's lead off if this thread leads a quick phase; else does nothing. Never
  /// blocks, any thread.
  virtual void long_work_ahead() const = 0;
};

/// The scope of a layer above the codec for the handles it owns inside a payload: values that
/// stand for state kept elsewhere (an RRef). That layer derives its own scopes from it: where
/// received handles bind, what sent handles create. It finds them in codec_context::handles.
/// The codec carries the pointer and never looks into it.
class handle_scope {
 public:
  virtual ~handle_scope() = default;
};

/// Note [codec context]
///
/// What steers an encode or a decode beyond the value itself travels in one codec_context.
/// The caller builds it on its stack and hands it to the writer or reader. The codec reads
/// nothing else (no thread-local state). Every field is optional (null: the plain behaviour):
///   * keeper: inline tensors of at least adopt_min_bytes read from its buffer view it
///     (Note [adopted payload]);
///   * results: where CUDA results (kind 4) of the peer go back to (Note [rpc device map]);
///   * devices: how CUDA tensors are written to the peer (kinds 3, 4, 5); null: staged as CPU
///     tensors (kind 0);
///   * bulk, shm and peer: the node's segments and byte pool, and whether tensors may go over
///     shared memory to `peer`. See Note [tensor over shared memory]. The byte pool is used with or
///     without shm (Note [byte pool]);
///   * scope: the interceptor's view of this message (Note [call interceptor]);
///   * gather and borrow: the sender's list of tensors it writes from their storage, and whether
///     this encode may add to it. Only the encode whose buffer is the message's payload sets
///     them (Note [borrowed tensor bytes] in src/rpc/borrowed_parts.hpp);
///   * work: told before a large tensor is copied (Note [predicted quick]);
///   * handles: the scope of the layer that owns the handles inside the value. For RRefs it says
///     where received ones bind and what sent ones create (Note [RRef protocol]);
///   * reply_to: in a served call's answer, the worker that called (handles in the result
///     know where they go);
///   * stored: the value is encoded to be kept (an RRef's value), not sent in one message;
///     handles inside it are refused.
/// A nested encode builds its own context: a payload inside a payload, a served function's own
/// calls. So two nodes of one process encoding on one thread never see each other's settings.
/// A context refers to what its builder owns, and must not outlive it. It is not copied into
/// anything that outlives the encode or decode.
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
  const long_work_notice* work = nullptr;
  handle_scope* handles = nullptr;
  const std::string* reply_to = nullptr;
  bool stored = false;
};

/// The context of an encode or decode that nothing steers (values stored, meta bytes, tests).
inline constexpr codec_context plain_context{};

}  // namespace troupe::rpc
