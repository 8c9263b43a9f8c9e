#pragma once
/// \file interceptor.hpp
/// The call interceptor. Through it a layer above the runtime (distributed autograd) sees the
/// tensors of every RPC. It attaches its own bytes to the message; the runtime does not know why.
///
/// Note [call interceptor]
/// A node has at most one interceptor (node::set_interceptor). For every call it makes and
/// every call it serves, the runtime asks the interceptor for a `call_scope` (null: not
/// intercepted). It puts that scope in the codec context of the message's encode and decode
/// (Note [codec context] in codec_context.hpp). Nothing about it is kept per thread.
/// The codec reports every tensor it writes (`on_tensor_written`). It passes every tensor it
/// reads through `on_tensor_read`, which may return a different tensor (for example one that
/// carries a grad_fn). After encoding, `take_meta()` gives the bytes that travel with the message,
/// beside the payload, through the transport hook. Before decoding, `on_meta` gets the bytes that
/// arrived with it.
///
///   caller (user thread)                          callee (executor thread)
///   s = begin_call(to, fn)                        s = begin_serve(from, fn, request_meta)
///   [s entered] encode args -> on_tensor_written  [s entered] decode args -> on_tensor_read
///   request_meta = s.take_meta()                  [s entered] run fn (nested calls begin their
///   ... response arrives ...                                  own scopes, see below)
///   [s entered] s.on_meta(response_meta)          [s entered] encode result -> on_tensor_written
///               decode result -> on_tensor_read   response_meta = s.take_meta()
///
/// `enter()` runs before a scope's encode or decode. On the callee it runs before the argument
/// decode, and again on the thread that completes a deferred reply. `leave()` runs after it (on
/// the callee: after the result encode).
/// A served function runs between its scope's enter() and leave(). The interceptor may set its
/// own state there: distributed autograd makes the caller's context current. By that state a
/// call the function makes knows in begin_call that it is nested. The runtime hands begin_call
/// only the peer and the function.
/// A value encoded outside a message is reported to no one: an RRef's stored value, bytes a
/// function encodes itself. Arguments nested in a served call's are decoded with its context
/// (reply_later::with_context) and reported as its.
///
/// Threads: begin_call runs on the calling user thread. begin_serve, the argument decode, the
/// function and the result encode run on one executor thread. The response decode runs on the
/// thread that takes the result (future::get / then). Never on a CAF scheduler thread. A scope's
/// methods are called from one thread at a time. The response decode happens at most once per
/// call.
/// Covered: tensors written by the codec itself (arguments, results, and tensors inside vectors,
/// maps, tuples). Not covered: tensors inside user structs serialized through their own
/// Boost `serialize` (troupe/tensors/boost_tensor.hpp) — they travel without notification.
/// Errors: an exception thrown by the interceptor on the caller side fails the call (the future
/// carries it). On the callee side it becomes the call's remote_exception.

#include <memory>
#include <string>
#include <vector>

#include "troupe/tensors/tensor.hpp"

namespace troupe::rpc {

/// The interceptor's view of one message exchange (a call on the caller, a served call on the
/// callee). See Note [call interceptor].
class call_scope {
 public:
  virtual ~call_scope() = default;
  /// A tensor the codec is writing into the message (caller: an argument; callee: the result).
  virtual void on_tensor_written(const tensor& /*t*/) {}
  /// A tensor the codec read from the message; the returned tensor is what the user gets.
  virtual tensor on_tensor_read(tensor t) { return t; }
  /// The bytes to attach to the message just encoded (empty: none). Called once per encode.
  virtual std::vector<char> take_meta() { return {}; }
  /// The bytes that arrived with the message about to be decoded (caller: the response's).
  virtual void on_meta(const std::vector<char>& /*meta*/) {}
  /// A scope_guard of this scope begins on the current thread.
  virtual void enter() {}
  /// That scope_guard ends.
  virtual void leave() {}
};

/// Creates scopes; installed once per node. Implementations must be thread-safe.
class call_interceptor {
 public:
  virtual ~call_interceptor() = default;
  /// A call to worker `to` is about to be encoded on this (user) thread. Null: not intercepted.
  virtual std::shared_ptr<call_scope> begin_call(const std::string& to, const std::string& function) = 0;
  /// A call from worker `from` is about to be served on this (executor) thread, with the meta
  /// bytes the caller attached (maybe empty). Null: not intercepted.
  virtual std::shared_ptr<call_scope> begin_serve(const std::string& from, const std::string& function,
                                                  const std::vector<char>& meta) = 0;
};

/// Runs `s->enter()` when made and `s->leave()` when destroyed; a null `s` does nothing. That is
/// the span in which a scope's message is encoded or decoded, or its served function runs. RAII;
/// not copyable; destroyed on the thread that created it. An exception from enter() propagates
/// (leave() does not run then); one from leave() is swallowed.
class scope_guard {
 public:
  explicit scope_guard(call_scope* s);
  ~scope_guard();
  scope_guard(const scope_guard&) = delete;
  scope_guard& operator=(const scope_guard&) = delete;

 private:
  call_scope* scope_;
};

}  // namespace troupe::rpc
