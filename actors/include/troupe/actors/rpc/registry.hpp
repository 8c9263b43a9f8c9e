#pragma once
/// \file registry.hpp
/// The function registry of a node: user functions registered by name with a typed signature.
///
///   troupe::rpc::registry reg;
///   reg.add("add", [](int a, int b) { return a + b; });
///   troupe::node n(opts, reg);           // or n.functions().add(...) after start
///
/// A registered callable must have one non-template call signature (a lambda without `auto`
/// parameters, a function pointer, a std::function). Arguments are taken by value; each type
/// must be supported by the codec (codec.hpp). The callee checks the received arguments against
/// the signature (bad_argument names index, expected and received type).

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <unordered_map>
#include <vector>

#include "troupe/actors/rpc/codec.hpp"

namespace troupe::rpc {

/// A result the served function encoded itself (the bytes of `encode_result<T>(value)`). It is
/// sent as is. The caller decodes it as T (`rpc_sync<T>`); the caller's interceptor sees its
/// tensors. Encoded outside the served call's codec context (Note [codec context]), so the callee's
/// interceptor does not see its tensors and they travel as inline bytes. For layers that keep
/// values type-erased.
struct encoded_result {
  std::vector<char> bytes;
};

/// A value kept as its live object and encoded only when it is sent. An OwnerRRef's value is
/// encoded when a to_here is answered, under that call's interceptor scope. So the interceptor
/// sees the very tensors the function returned. Immutable once made; thread-safe.
class held_value {
 public:
  virtual ~held_value() = default;
  /// `encode_result<T>(ctx, value)`, on the calling thread (the interceptor scope of `ctx` sees
  /// its tensors). Throws what the codec throws.
  virtual std::vector<char> encode(const codec_context& ctx) const = 0;
  /// typeid(T); typeid(encoded_result) for a value held as bytes (hold_encoded).
  virtual const std::type_info& type() const = 0;
  /// The object, of type type().
  virtual const void* object() const = 0;
};

namespace detail {
template <class T>
class held final : public held_value {
 public:
  explicit held(T value) : value_(std::move(value)) {}
  std::vector<char> encode(const codec_context& ctx) const override {
    if constexpr (std::is_same_v<T, encoded_result>) return value_.bytes;
    else return encode_result<T>(ctx, value_);
  }
  const std::type_info& type() const override { return typeid(T); }
  const void* object() const override { return &value_; }

 private:
  T value_;
};
}  // namespace detail

/// Holds `value` as a live object (see held_value).
template <class T>
std::shared_ptr<const held_value> hold(T value) {
  return std::make_shared<detail::held<std::decay_t<T>>>(std::move(value));
}
/// Holds bytes already encoded (encode_result<T> of some T); encode() returns them.
inline std::shared_ptr<const held_value> hold_encoded(std::vector<char> bytes) { return hold(encoded_result{std::move(bytes)}); }

/// Thrown by a served function to answer the call with this code and message, instead of
/// wrapping it as remote_exception. For example `invalid_state` or a stored `remote_exception`.
class reply_error : public error {
 public:
  using error::error;
};

/// The return value of a served function that answers later through served_call::defer().
struct deferred {};

class reply_batch;

/// A reply given later (Note [deferred reply] in src/rpc/serve.cpp). Thread-safe; the first
/// complete/fail wins, later ones do nothing. Dropping the last handle without answering answers
/// the caller with invalid_state, so a forgotten reply never hangs a caller. An answer given
/// into a reply_batch leaves when the batch ends (Note [reply batch]); any other leaves at once.
class reply_later {
 public:
  virtual ~reply_later() = default;
  /// Answers with `value` (encoded now, on the calling thread, under the served call's codec
  /// context; see Note [codec context] and Note [call interceptor]).
  template <class T>
  void complete(const T& value) {
    complete_encoded([&value](const codec_context& ctx) { return encode_result<T>(ctx, value); });
  }
  /// Answers with `value` into `batch`: written when the batch ends.
  template <class T>
  void complete(const T& value, reply_batch& batch) {
    complete_encoded([&value](const codec_context& ctx) { return encode_result<T>(ctx, value); }, &batch);
  }
  /// Answers with the bytes `encode(ctx)` returns (encode_result<T> of the value the caller
  /// expects), `ctx` being the served call's codec context; into `batch` when given. An exception
  /// from `encode` answers with remote_exception.
  virtual void complete_encoded(const std::function<std::vector<char>(const codec_context&)>& encode,
                                reply_batch* batch = nullptr) = 0;
  /// Runs `fn` with the served call's codec context for a decode: its peer, shared memory and
  /// interceptor scope. It is for a payload nested in the call's arguments, decoded inside the
  /// served function on its thread. So the interceptor sees its tensors as part of the call.
  virtual void with_context(const std::function<void(const codec_context&)>& fn) const = 0;
  /// Answers with this error code and message, into `batch` when given.
  virtual void fail(errc code, const std::string& message, reply_batch* batch = nullptr) = 0;
};

/// The call a served function is answering. A registered function whose first parameter is
/// `rpc::served_call&` receives it; the caller does not pass it. It is valid while the function
/// runs, on its executor thread:
///
///   reg.add("later", [](rpc::served_call& call, int x) -> rpc::deferred {
///     park(call.defer(), x);  // answered later, from any thread
///     return {};
///   });
class served_call {
 public:
  /// Makes the call answered later through the returned handle (from any thread); the function
  /// then returns `rpc::deferred{}`. Throws invalid_state when called twice for one call.
  virtual std::shared_ptr<reply_later> defer() = 0;

 protected:
  ~served_call() = default;
};

namespace detail {
// The decoded parameters of a registered function: all of them, or all after a leading served_call&.
template <class... A> struct parameters {
  static constexpr bool takes_call = false;
  using args = std::tuple<std::decay_t<A>...>;
};
template <class... A> struct parameters<served_call&, A...> {
  static constexpr bool takes_call = true;
  using args = std::tuple<std::decay_t<A>...>;
};

template <class F> struct signature : signature<decltype(&F::operator())> {};
template <class R, class... A> struct signature<R (*)(A...)> : parameters<A...> {
  using result = R;
};
template <class R, class... A> struct signature<R(A...)> : signature<R (*)(A...)> {};
template <class C, class R, class... A> struct signature<R (C::*)(A...)> : signature<R (*)(A...)> {};
template <class C, class R, class... A> struct signature<R (C::*)(A...) const> : signature<R (*)(A...)> {};
template <class C, class R, class... A> struct signature<R (C::*)(A...) noexcept> : signature<R (*)(A...)> {};
template <class C, class R, class... A> struct signature<R (C::*)(A...) const noexcept> : signature<R (*)(A...)> {};

/// `fn(args)`, or `fn(*call, args)` for a function that takes the served call.
template <bool TakesCall, class F, class... A>
decltype(auto) call_decoded(F& fn, std::tuple<A...>& args, served_call* call) {
  if constexpr (TakesCall) {
    if (!call) throw error(errc::invalid_state, "a function that takes rpc::served_call was run outside a served call");
    return std::apply([&](A&&... a) -> decltype(auto) { return fn(*call, std::move(a)...); }, std::move(args));
  } else {
    return std::apply(fn, std::move(args));
  }
}

template <class R, bool TakesCall, class F, class... A>
std::vector<char> invoke_decoded(const codec_context& ctx, F& fn, std::tuple<A...>& args, served_call* call) {
  if constexpr (std::is_same_v<std::decay_t<R>, encoded_result>) {
    return call_decoded<TakesCall>(fn, args, call).bytes;
  } else if constexpr (std::is_same_v<std::decay_t<R>, deferred> || std::is_void_v<R>) {
    call_decoded<TakesCall>(fn, args, call);  // a deferred one answers through served_call::defer()'s handle
    return {};
  } else {
    codec_context top = ctx;
    top.borrow = true;  // these bytes are the response's payload (Note [borrowed tensor bytes])
    return encode_result<std::decay_t<R>>(top, call_decoded<TakesCall>(fn, args, call));
  }
}

/// Runs `fn(args)` and keeps its result as a live object (function_entry::invoke_held).
template <class R, bool TakesCall, class F, class... A>
std::shared_ptr<const held_value> invoke_held(F& fn, std::tuple<A...>& args, const std::string& name) {
  if constexpr (std::is_same_v<std::decay_t<R>, deferred> || TakesCall) {
    throw error(errc::not_supported, "function '" + name + "' answers through rpc::served_call and cannot make a stored value");
  } else if constexpr (std::is_void_v<R>) {
    std::apply(fn, std::move(args));
    return hold_encoded({});
  } else {
    return hold<std::decay_t<R>>(std::apply(fn, std::move(args)));
  }
}

template <class Tuple> struct decoder;
template <class... A> struct decoder<std::tuple<A...>> {
  static std::tuple<A...> decode(const codec_context& ctx, const std::vector<char>& bytes, const std::string& fn) {
    return decode_args<A...>(ctx, bytes, fn);
  }
};
}  // namespace detail

/// How the runtime may run a registered function.
struct function_options {
  /// The function never blocks and returns within microseconds (the runtime's reserved control
  /// functions: an RRef fetch, fork request or delete). A leading executor thread runs such
  /// requests itself, before the others it read, instead of waking a thread for each
  /// (Note [direct channel]). A user function that may block or run long must not set it: requests
  /// read after it would wait for it. Functions whose recent runs were all short are run the
  /// same way without it. A watchdog then covers the run that turns out long
  /// (Note [predicted quick] in the executor).
  bool quick = false;
};

/// How a function's recent runs went, kept by the runtime (Note [predicted quick]).
struct run_history {
  /// Runs in a row that took under the executor's short-run bound (a long run resets it).
  std::atomic<std::uint32_t> short_streak{0};
  /// A recent run's duration, high side (ns): rises at once to a longer run, decays by 1/8 a run.
  std::atomic<std::uint32_t> recent_ns{0};
};

/// A type-erased registered function. It decodes the arguments (throws bad_argument), runs the
/// user function (its exceptions propagate unchanged) and encodes the result. Decode and encode
/// run under the served call's codec context (Note [codec context]).
struct function_entry {
  std::string name;
  std::string signature;  ///< "int32(int32,string)", for messages
  bool quick = false;     ///< function_options::quick
  std::shared_ptr<run_history> history = std::make_shared<run_history>();  ///< the runtime's record
  /// `call` is the served call, handed to a function that takes it (null outside a served call:
  /// such a function then throws invalid_state).
  std::function<std::vector<char>(const codec_context& ctx, const std::vector<char>& args, const std::function<void()>& before_call,
                                  served_call* call)>
      invoke;
  /// Like invoke, but keeps the result as a live object instead of encoding it (remote(): the
  /// OwnerRRef stores it). Throws not_supported for a function that takes the served call.
  std::function<std::shared_ptr<const held_value>(const codec_context& ctx, const std::vector<char>& args,
                                                  const std::function<void()>& before_call)>
      invoke_held;
};

/// Thread-safe map name -> function. Shared by a node's agent and its executor threads.
class registry {
 public:
  registry() = default;
  registry(const registry& other);
  registry& operator=(const registry&) = delete;

  /// Registers (or replaces) `fn` under `name`. Thread-safe; may be called while serving.
  template <class F>
  void add(const std::string& name, F fn, function_options opts = {}) {
    using sig = detail::signature<std::decay_t<F>>;
    using R = typename sig::result;
    using Args = typename sig::args;
    constexpr bool takes_call = sig::takes_call;
    function_entry e;
    e.name = name;
    e.signature = type_tag_or_void<R>() + "(" + tags_of(static_cast<Args*>(nullptr)) + ")";
    e.quick = opts.quick;
    auto shared = std::make_shared<F>(std::move(fn));  // one callable behind both entry points
    e.invoke = [name, shared](const codec_context& ctx, const std::vector<char>& bytes, const std::function<void()>& before,
                              served_call* call) {
      Args args = detail::decoder<Args>::decode(ctx, bytes, name);
      before();
      return detail::invoke_decoded<R, takes_call>(ctx, *shared, args, call);
    };
    e.invoke_held = [name, shared](const codec_context& ctx, const std::vector<char>& bytes, const std::function<void()>& before) {
      Args args = detail::decoder<Args>::decode(ctx, bytes, name);
      before();
      return detail::invoke_held<R, takes_call>(*shared, args, name);
    };
    put(std::move(e));
  }

  /// The entry registered under `name`, or nullptr. The entry stays valid while registered.
  std::shared_ptr<const function_entry> find(const std::string& name) const;
  /// Registered names (for error messages and tests).
  std::vector<std::string> names() const;

 private:
  template <class R> static std::string type_tag_or_void() {
    if constexpr (std::is_void_v<R>) return "void"; else return type_tag<R>();
  }
  template <class... A> static std::string tags_of(std::tuple<A...>*) { return detail::join_tags<A...>(); }
  void put(function_entry e);

  mutable std::mutex mutex_;
  std::unordered_map<std::string, std::shared_ptr<const function_entry>> entries_;
};

}  // namespace troupe::rpc

/// Registers the free function `fn` in `reg` under its own name: TROUPE_RPC_FUNCTION(reg, add).
#define TROUPE_RPC_FUNCTION(reg, fn) (reg).add(#fn, &fn)
