#pragma once
/// \file api.hpp
/// Calling remote functions.
///
///   int s = troupe::rpc_sync<int>(n, "worker1", "add", 1, 2);                       // default deadline
///   int s = troupe::rpc_sync<int>(n, "worker1", "add", troupe::rpc::deadline{500ms}, 1, 2);
///   auto f = troupe::rpc_async<int>(n, "worker1", "add", 1, 2); f.get();
///
/// Arguments follow the function name; an optional `rpc::deadline` right after the name sets
/// the call's timeout (otherwise node_options::default_timeout). Arguments are encoded with
/// their own types (codec.hpp): pass exactly the types of the registered signature (an `int`
/// literal is int32, `1.0` is float64, a string literal is converted to std::string).
/// Errors (thrown by rpc_sync and by future::get): unknown_function, bad_argument,
/// remote_exception, timeout, peer_lost, unauthorized, invalid_state.

#include <chrono>
#include <string>
#include <type_traits>

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
}  // namespace detail
}  // namespace rpc

/// Calls `function` on worker `to` without blocking (beyond resolving a new peer); see file
/// comment for the argument conventions.
template <class R, class... Args>
rpc::future<R> rpc_async(node& n, const std::string& to, const std::string& function, rpc::deadline d, const Args&... args) {
  auto encode = [&] { return rpc::encode_args<rpc::detail::wire_t<Args>...>(rpc::detail::wire_t<Args>(args)...); };
  return rpc::future<R>(n.call(to, function, encode, d.value));
}

template <class R, class... Args>
rpc::future<R> rpc_async(node& n, const std::string& to, const std::string& function, const Args&... args) {
  return rpc_async<R>(n, to, function, rpc::deadline{n.default_timeout()}, args...);
}

/// Calls `function` on worker `to` and blocks the calling thread until the result (or error).
template <class R, class... Args>
R rpc_sync(node& n, const std::string& to, const std::string& function, rpc::deadline d, const Args&... args) {
  return rpc_async<R>(n, to, function, d, args...).get();
}

template <class R, class... Args>
R rpc_sync(node& n, const std::string& to, const std::string& function, const Args&... args) {
  return rpc_async<R>(n, to, function, rpc::deadline{n.default_timeout()}, args...).get();
}

}  // namespace troupe
