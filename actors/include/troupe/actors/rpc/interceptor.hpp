#pragma once
/// \file interceptor.hpp
/// The call interceptor: how a layer above the runtime (distributed autograd) sees the tensors
/// of every RPC and attaches its own bytes to the message, without the runtime knowing why.
///
/// Note [call interceptor]
/// A node has at most one interceptor (node::set_interceptor). For every call it makes and every
/// call it serves, the runtime asks the interceptor for a `call_scope` (null: not intercepted)
/// and keeps that scope *active on the thread* while the message's payload is encoded or decoded.
/// The codec reports every tensor it writes (`on_tensor_written`) and passes every tensor it
/// reads through `on_tensor_read`, which may return a different tensor (for example one that
/// carries a grad_fn). After encoding, `take_meta()` gives the bytes that travel with the message
/// (beside the payload, through the transport hook); before decoding, `on_meta` gets the bytes that
/// arrived with it.
///
///   caller (user thread)                          callee (executor thread)
///   s = begin_call(to, fn)                        s = begin_serve(from, fn, request_meta)
///   [s active] encode args -> on_tensor_written   [s active] decode args -> on_tensor_read
///   request_meta = s.take_meta()                  [s active] run fn (nested calls begin their own
///   ... response arrives ...                                  scope on top of s, see below)
///   [s active] s.on_meta(response_meta)           [s active] encode result -> on_tensor_written
///              decode result -> on_tensor_read    response_meta = s.take_meta()
///
/// Scopes nest: the active scope is a per-thread stack, so a user function that makes its own
/// RPC while its serve scope is active begins a call scope on top of it (the interceptor can read
/// `active_scope()` in begin_call to know it is nested). `enter()` runs when a guard pushes the
/// scope and `leave()` when that guard pops it (the interceptor may set its own thread-local
/// state there, e.g. the current autograd context while a served function runs); a scope pushed
/// on top does not make the one below leave.
///
/// Threads: begin_call runs on the calling user thread; begin_serve, the argument decode, the
/// function and the result encode on one executor thread; the response decode on the thread that
/// takes the result (future::get / then). Never on a CAF scheduler thread. A scope's methods are
/// called from one thread at a time. The response decode happens at most once per call.
/// Covered: tensors written by the codec itself (arguments, results, and tensors inside vectors,
/// maps, tuples). Not covered: tensors inside user structs serialized through their own
/// Boost `serialize` (troupe/tensors/boost_tensor.hpp) — they travel without notification.
/// Errors: an exception thrown by the interceptor on the caller side fails the call (the future
/// carries it); on the callee side it becomes the call's remote_exception.

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
  /// A guard pushed this scope on the current thread's stack.
  virtual void enter() {}
  /// The guard that pushed this scope popped it.
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

/// The scope active on the calling thread (top of its stack), or null.
call_scope* active_scope();

/// Makes `s` the active scope of the current thread for its lifetime (a null `s` pushes
/// nothing). RAII; not copyable; must be destroyed on the thread that created it.
class scope_guard {
 public:
  explicit scope_guard(call_scope* s);
  ~scope_guard();
  scope_guard(const scope_guard&) = delete;
  scope_guard& operator=(const scope_guard&) = delete;

 private:
  call_scope* scope_;
  call_scope* previous_;
};

/// Hides the active scope of the current thread for its lifetime, so an encode or decode that is
/// not part of the message (e.g. storing a value while a served function runs) reports nothing.
/// Guards created inside it nest normally. RAII; destroyed on the thread that created it.
class hide_scope {
 public:
  hide_scope();
  ~hide_scope();
  hide_scope(const hide_scope&) = delete;
  hide_scope& operator=(const hide_scope&) = delete;

 private:
  call_scope* previous_;
};

}  // namespace troupe::rpc
