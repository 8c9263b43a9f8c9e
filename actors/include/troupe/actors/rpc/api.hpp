#pragma once
/// \file api.hpp
/// Calling remote functions.
///
///   int s = troupe::rpc_sync<int>(n, "worker1", "add", 1, 2);          // default deadline
///   int s = troupe::rpc_sync<int>(n, "worker1", "add", 1, 2, 500ms);   // timeout last
///   auto f = troupe::rpc_async<int>(n, "worker1", "add", 1, 2, troupe::rpc::deadline{2s});
///   f.get();
///
/// Arguments follow the function name. An optional timeout as the LAST argument sets the call's
/// deadline: an `rpc::deadline` or any std::chrono duration, rounded up to milliseconds.
/// Otherwise node_options::default_timeout applies. The form with the `rpc::deadline` right
/// after the function name also works; new code puts it last.
/// Arguments are encoded with their own types (codec.hpp). Pass exactly the types of the
/// registered signature: an `int` literal is int32, `1.0` is float64, a string literal is
/// converted to std::string.
/// Errors (thrown by rpc_sync and by future::get): unknown_function, bad_argument,
/// remote_exception, timeout, peer_lost, unauthorized, invalid_state.

#include <chrono>
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "troupe/actors/node.hpp"
#include "troupe/actors/rpc/codec.hpp"
#include "troupe/actors/rpc/future.hpp"

namespace troupe {

namespace rpc {
/// The timeout of one call.
struct deadline {
  std::chrono::milliseconds value;
};

namespace detail {
template <class T>
using wire_t = std::conditional_t<std::is_convertible_v<T, const char*>, std::string, std::decay_t<T>>;

template <class T> struct is_timeout : std::false_type {};
template <> struct is_timeout<deadline> : std::true_type {};
template <class Rep, class Period> struct is_timeout<std::chrono::duration<Rep, Period>> : std::true_type {};

/// Whether the last of Args is a timeout (rpc::deadline or a chrono duration).
template <class... Args>
constexpr bool last_is_timeout() {
  if constexpr (sizeof...(Args) == 0) return false;
  else return is_timeout<std::decay_t<std::tuple_element_t<sizeof...(Args) - 1, std::tuple<Args...>>>>::value;
}

inline std::chrono::milliseconds to_timeout(const deadline& d) { return d.value; }
template <class Rep, class Period>
std::chrono::milliseconds to_timeout(const std::chrono::duration<Rep, Period>& d) {
  return std::chrono::ceil<std::chrono::milliseconds>(d);
}

/// An argument as the codec takes it: string literals become strings, everything else is passed
/// by reference (no copy; move-only arguments such as rrefs work).
template <class T>
decltype(auto) to_wire(const T& x) {
  if constexpr (std::is_convertible_v<const T&, const char*>) return std::string(x);
  else return (x);
}

// `blocking`: rpc_sync, whose caller waits at once (node::call).
template <class R, class... Args>
future<R> call_with(node& n, const std::string& to, const std::string& function, std::chrono::milliseconds timeout,
                    bool blocking, const Args&... args) {
  auto encode = [&](const codec_context& ctx) {
    codec_context top = ctx;
    top.borrow = true;  // these bytes are the payload (Note [borrowed tensor bytes])
    return encode_args<wire_t<Args>...>(top, to_wire(args)...);
  };
  return future<R>(n.call(to, function, encode, timeout, blocking));
}

template <class R, class Tuple, std::size_t... I>
future<R> call_timeout_last(node& n, const std::string& to, const std::string& function, bool blocking, const Tuple& args,
                            std::index_sequence<I...>) {
  return call_with<R>(n, to, function, to_timeout(std::get<sizeof...(I)>(args)), blocking, std::get<I>(args)...);
}

template <class R, class... Args>
future<R> call_any(node& n, const std::string& to, const std::string& function, bool blocking, const Args&... args) {
  if constexpr (last_is_timeout<Args...>()) {
    return call_timeout_last<R>(n, to, function, blocking, std::forward_as_tuple(args...), std::make_index_sequence<sizeof...(Args) - 1>{});
  } else {
    return call_with<R>(n, to, function, n.default_timeout(), blocking, args...);
  }
}
}  // namespace detail
}  // namespace rpc

/// Calls `function` on worker `to` without blocking (beyond resolving a new peer). `args` may
/// end with a timeout (see the file comment).
template <class R, class... Args>
rpc::future<R> rpc_async(node& n, const std::string& to, const std::string& function, const Args&... args) {
  return rpc::detail::call_any<R>(n, to, function, false, args...);
}

/// The older form, deadline first: `rpc_async<R>(n, to, fn, rpc::deadline{t}, args...)`.
template <class R, class... Args>
rpc::future<R> rpc_async(node& n, const std::string& to, const std::string& function, rpc::deadline d, const Args&... args) {
  return rpc::detail::call_with<R>(n, to, function, d.value, false, args...);
}

/// Calls `function` on worker `to` and blocks the calling thread until the result (or error).
/// `args` may end with a timeout (see the file comment).
template <class R, class... Args>
R rpc_sync(node& n, const std::string& to, const std::string& function, const Args&... args) {
  return rpc::detail::call_any<R>(n, to, function, true, args...).get();
}

/// The older form, deadline first: `rpc_sync<R>(n, to, fn, rpc::deadline{t}, args...)`.
template <class R, class... Args>
R rpc_sync(node& n, const std::string& to, const std::string& function, rpc::deadline d, const Args&... args) {
  return rpc::detail::call_with<R>(n, to, function, d.value, true, args...).get();
}

}  // namespace troupe
