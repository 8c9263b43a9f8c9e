#pragma once
/// \file rref.hpp
/// Remote references (Note [RRef protocol] in rref/context.hpp).
///
///   troupe::rref_context ctx(n);                                   // one per node
///   troupe::add_function(ctx, "make_vec", [](int k) { return std::vector<int>(k, 1); });
///   auto r = troupe::remote<std::vector<int>>(ctx, "worker1", "make_vec", 3);  // returns at once
///   auto q = troupe::remote<std::vector<int>>(ctx, "worker1", "make_vec", 3, 2s);  // timeout last
///   std::vector<int> v = r.to_here(5s);                            // blocks up to 5 s
///   auto r2 = r.share();                                           // a second handle, explicitly
///   int n = troupe::rpc_sync<int>(ctx, "worker2", "count", r);     // rref as argument
///   auto ps = troupe::make_rref(ctx, parameter_server{});          // owner-local
///   ps.rpc_sync<double>("push", grads);                            // method on the owner
///
/// Functions that take or return RRefs are registered with add_function / add_method, which
/// bind received RRefs to the context. They are called with the rref_context overloads of
/// rpc_sync / rpc_async, so the RRefs in their results are bound too.

#include <chrono>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include <boost/serialization/split_member.hpp>

#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/rref/context.hpp"

namespace troupe {

namespace rref_detail {

/// An argument as the codec writes it, without copying it (rrefs are move-only).
template <class T>
decltype(auto) to_wire(const T& x) {
  if constexpr (std::is_convertible_v<const T&, const char*>) return std::string(x);
  else return (x);
}

/// The encoder of an argument list, by reference (runs inside node::call).
template <class... A>
auto encoder(const A&... a) {
  return [&a...](const rpc::codec_context& ctx) { return rpc::encode_args<rpc::detail::wire_t<A>...>(ctx, to_wire(a)...); };
}

/// A call through node::call (the rpc future path) whose arguments are encoded without copies.
/// `sent` collects the forks of the RRefs among them (Note [codec context]).
template <class R, class... A>
rpc::future<R> call_node(node& n, const std::string& to, const std::string& function, std::chrono::milliseconds timeout,
                         send_scope& sent, const A&... a) {
  return rpc::future<R>(n.call(to, function, [&](const rpc::codec_context& ctx) {
    rpc::codec_context with = ctx;
    with.handles = &sent;
    return rpc::encode_args<rpc::detail::wire_t<A>...>(with, to_wire(a)...);
  }, timeout));
}

template <class F, class Tuple, std::size_t... I>
decltype(auto) apply_first(std::chrono::milliseconds timeout, F& fn, const Tuple& args, std::index_sequence<I...>) {
  return fn(timeout, std::get<I>(args)...);
}

// A trailing timeout argument: rpc::deadline or a chrono duration (rounded up to ms).
template <class X> struct timeout_arg : std::false_type {};
template <> struct timeout_arg<rpc::deadline> : std::true_type {};
template <class Rep, class Period> struct timeout_arg<std::chrono::duration<Rep, Period>> : std::true_type {};
inline std::chrono::milliseconds as_timeout(const rpc::deadline& d) { return d.value; }
template <class Rep, class Period>
std::chrono::milliseconds as_timeout(const std::chrono::duration<Rep, Period>& d) {
  return std::chrono::ceil<std::chrono::milliseconds>(d);
}

/// Calls `fn(timeout, args...)` without a trailing timeout argument (rpc::deadline or a chrono
/// duration) if there is one, taking the timeout from it; else with `fallback`.
template <class F, class... Args>
decltype(auto) split_timeout(std::chrono::milliseconds fallback, F&& fn, const Args&... args) {
  auto all = std::forward_as_tuple(args...);
  constexpr bool trailing = sizeof...(Args) > 0 && timeout_arg<std::decay_t<std::tuple_element_t<sizeof...(Args) - (sizeof...(Args) > 0), std::tuple<Args..., void>>>>::value;
  if constexpr (trailing)
    return apply_first(as_timeout(std::get<sizeof...(Args) - 1>(all)), fn, all, std::make_index_sequence<sizeof...(Args) - 1>{});
  else
    return apply_first(fallback, fn, all, std::make_index_sequence<sizeof...(Args)>{});
}

/// The value of type T of a held value. It is a copy of the live object when that is a T (for a
/// tensor: the same tensor). Else it is decoded from its encoding (a value held as bytes). Not
/// part of any message: no interceptor scope sees it.
template <class T>
T value_of(const std::shared_ptr<const rpc::held_value>& v, const std::string& what) {
  if constexpr (std::is_copy_constructible_v<T>) {
    if (v->type() == typeid(T)) return *static_cast<const T*>(v->object());
  }
  return rpc::decode_result<T>(v->encode(stored_context), what);  // an rref inside is refused (Note [RRef protocol])
}

/// Runs `start(scope)`, a node-level rpc_async encoding under `scope`. It collects the forks of
/// the RRefs it encodes. If the call fails they are probed, so a lost call does not leak them.
template <class R, class Start>
rpc::future<R> probed_call(const std::shared_ptr<context_impl>& c, const std::string& to, Start start) {
  send_scope scope;
  rpc::future<R> f = start(scope);
  auto sent = scope.take();
  if (!sent.empty()) {
    std::weak_ptr<context_impl> weak = c;
    f.then([weak, to, sent = std::move(sent)](const rpc::future<R>& done) mutable {
      try {
        (void)done.get();
      } catch (const error&) {
        if (auto cc = weak.lock()) probe(*cc, to, std::move(sent));
      }
    });
  }
  return f;
}

}  // namespace rref_detail

/// A reference to a value of type T owned by one worker: an identity object, move-only. A
/// second handle on the same reference is made explicitly with share(). Handles made by share()
/// hold one reference together: one fork on a user, one local ref on the owner. The last one's
/// destruction releases it (G1). Thread-safe.
template <class T>
class rref {
 public:
  rref() = default;
  explicit rref(std::shared_ptr<rref_detail::handle> h) : h_(std::move(h)) {}
  rref(rref&&) noexcept = default;
  rref& operator=(rref&&) noexcept = default;
  rref(const rref&) = delete;
  rref& operator=(const rref&) = delete;

  /// A second handle on the same reference (no protocol message; the reference is released when
  /// the last of its handles is gone). Never blocks.
  rref share() const { return rref(h_); }

  /// The value, copied from the owner. The call's answer is decoded under its interceptor scope.
  /// So inside a distributed autograd context its tensors carry gradients back to the owner
  /// (Note [owner_rref actor]). On the owner: the live value, no message (a tensor is the
  /// same tensor). Blocks up to `timeout`. Throws remote_exception (the user function threw),
  /// owner_lost (the owner died), timeout, invalid_state (unbound rref).
  T to_here(std::chrono::milliseconds timeout = std::chrono::seconds(10)) const {
    if (h().owner_local) return rref_detail::value_of<T>(rref_detail::held_here(h(), timeout, true), "to_here of rref " + h().id.str());
    rref_detail::binding_scope scope(h().ctx.get());
    return rpc::future<T>(rref_detail::fetch_call(h(), timeout)).get(scope);
  }
  /// The live value, on its owner only (never blocks; a tensor is the same tensor, like
  /// PyTorch's local_value). Throws invalid_state elsewhere or while the value does not exist
  /// yet; remote_exception if the function threw.
  T local_value() const {
    return rref_detail::value_of<T>(rref_detail::held_here(h(), std::chrono::milliseconds(0), false), "local_value of rref " + h().id.str());
  }
  /// The owner's worker name.
  const std::string& owner_name() const { return h().owner; }
  /// Same as owner_name() (workers are named).
  const std::string& owner() const { return h().owner; }
  /// Whether this worker owns the value.
  bool is_owner() const { return h().owner_local || (h().ctx && h().bound && h().owner == node_of().info().name); }
  /// Whether the owner has confirmed this reference (Note [RRef protocol]). Never blocks.
  bool confirmed_by_owner() const { return rref_detail::confirmed(h()); }
  /// The RRef id.
  const rref_id& id() const { return h().id; }
  /// Whether this rref refers to anything.
  explicit operator bool() const { return h_ != nullptr; }

  /// Calls the method `name` (registered with add_method<T>) on the owner's value and blocks for
  /// its result; `args` may end with a timeout (rpc/api.hpp). Throws like rpc_sync, with
  /// owner_lost when the owner died.
  template <class R, class... A>
  R rpc_sync(const std::string& name, const A&... args) const {
    try {
      return rpc_async<R>(name, args...).get();
    } catch (const error& e) {
      if (e.code() != errc::peer_lost) throw;
      rref_detail::note_owner_lost(h());
      throw error(errc::owner_lost, "method '" + name + "' of rref " + h().id.str() + ": owner " + h().owner + " is lost (" + e.message() + ")");
    }
  }
  /// Like rpc_sync but returns the future at once (its errors: rpc_sync's, peer_lost for a dead
  /// owner).
  template <class R, class... A>
  rpc::future<R> rpc_async(const std::string& name, const A&... args) const {
    rref_detail::check_owner(h(), name.c_str());
    return rref_detail::split_timeout(node_of().default_timeout(), [&](std::chrono::milliseconds timeout, const auto&... a) {
      return rref_detail::probed_call<R>(h().ctx, h().owner, [&](rref_detail::send_scope& sent) {
        return rref_detail::call_node<R>(node_of(), h().owner, "troupe.rref.method." + name, timeout, sent, h().id, a...);
      });
    }, args...);
  }

  /// Calls the method `name` on the owner's value with remote() semantics: returns at once an
  /// rref<R> to its result, owned by this rref's owner. `args` may end with a timeout.
  template <class R, class... A>
  rref<R> remote(const std::string& name, const A&... args) const {
    rref_detail::check_owner(h(), name.c_str());
    const auto& id = h().id;
    return rref_detail::split_timeout(node_of().default_timeout(), [&](std::chrono::milliseconds timeout, const auto&... a) {
      return rref<R>(rref_detail::start_remote(*h().ctx, h().owner, "troupe.rref.method." + name, rref_detail::encoder(id, a...), timeout));
    }, args...);
  }

  /// The codec (Note [codec context]): sending forks the reference under the writer's context,
  /// receiving binds it to the reader's binding_scope, if any (Note [RRef protocol]).
  void write_payload(rpc::detail::writer& out) const {
    rpc::detail::write_value(out, rref_detail::fork_for_send(h(), out.context()));
  }
  void read_payload(rpc::detail::reader& in) {
    rref_msg::wire w;
    rpc::detail::read_value(in, w);
    if (auto* b = dynamic_cast<const rref_detail::binding_scope*>(in.context().handles)) {
      h_ = rref_detail::bind(*b->context(), w);
      return;
    }
    h_ = std::make_shared<rref_detail::handle>();
    h_->id = w.id;
    h_->owner = w.owner;
    h_->pending = std::make_unique<rref_msg::wire>(std::move(w));
  }
  /// Boost serialization (an rref inside a user struct) is refused with not_supported, since the
  /// archive carries no codec context. Pass it as an argument, or in a vector, map or tuple.
  template <class Ar> void save(Ar&, unsigned) const { refuse_archive(); }
  template <class Ar> void load(Ar&, unsigned) { refuse_archive(); }
  BOOST_SERIALIZATION_SPLIT_MEMBER()

  /// Binds an rref received outside a context (add_function does it). Internal.
  void bind_to(rref_detail::context_impl& c) {
    if (h_ && !h_->bound && h_->pending) h_ = rref_detail::bind(c, *h_->pending);
  }

 private:
  [[noreturn]] void refuse_archive() const {
    throw error(errc::not_supported, "an rref inside a Boost-serialized struct: pass it as an argument, or in a vector, map, pair or tuple");
  }
  const rref_detail::handle& h() const {
    if (!h_) throw error(errc::invalid_state, "use of an empty rref");
    return *h_;
  }
  node& node_of() const { return rref_detail::node_of(h()); }
  std::shared_ptr<rref_detail::handle> h_;
};

namespace rref_detail {

template <class X> struct is_rref : std::false_type {};
template <class X> struct is_rref<rref<X>> : std::true_type {};

template <class X>
void bind_arg(context_impl& c, X& x) {
  if constexpr (is_rref<X>::value) x.bind_to(c);
}

template <class R, class Tuple> struct binder;
template <class R, class... A> struct binder<R, std::tuple<A...>> {
  template <class F>
  static auto wrap(std::weak_ptr<context_impl> weak, F fn) {
    return [weak, fn = std::move(fn)](A... a) mutable -> R {
      if (auto c = weak.lock()) (bind_arg(*c, a), ...);
      return fn(std::move(a)...);
    };
  }
};
}  // namespace rref_detail

/// Registers `fn` on the context's node; RRef arguments it receives are bound to the context.
template <class F>
void add_function(rref_context& ctx, const std::string& name, F fn) {
  using sig = rpc::detail::signature<std::decay_t<F>>;
  ctx.this_node().functions().add(
      name, rref_detail::binder<typename sig::result, typename sig::args>::wrap(ctx.shared_impl(), std::move(fn)));
}

/// Registers the method `name` of T, callable through any rref<T> (rref::rpc_sync).
/// `fn(T&, args...)` runs on an executor thread of the owner while it holds the value's lease.
/// That allows one method per RRef at a time (Note [owner_rref actor]). So it must not call a
/// method of the same RRef. It works on a copy of the held object that then replaces it. Tensors
/// inside share storage with the held ones. Must return a value.
template <class T, class F>
void add_method(rref_context& ctx, const std::string& name, F fn) {
  using sig = rpc::detail::signature<std::decay_t<F>>;
  using R = typename sig::result;
  auto call = [&ctx, fn = std::move(fn)](const rref_id& id, auto&&... args) -> R {
    R out{};
    ctx.with_held(id, ctx.this_node().default_timeout(), [&](std::shared_ptr<const rpc::held_value>& v) {
      T obj = rref_detail::value_of<T>(v, "method of rref " + id.str());  // a copy: fetches may be encoding v
      out = fn(obj, args...);
      v = rpc::hold<T>(std::move(obj));
    });
    return out;
  };
  [&]<class Self, class... A>(std::tuple<Self, A...>*) {
    ctx.this_node().functions().add("troupe.rref.method." + name, [call](rref_id id, A... a) -> R { return call(id, a...); });
  }(static_cast<typename sig::args*>(nullptr));
}

/// Runs `function(args...)` on worker `to` and returns an rref<T> to its result at once.
/// `args` may end with a timeout (an rpc::deadline or a chrono duration) bounding the call;
/// else the node's default timeout applies. A lost call is confirmed by retried fork requests.
/// Throws what encoding the arguments throws (not_supported, invalid_state). Nothing else:
/// later errors come from to_here.
template <class T, class... Args>
rref<T> remote(rref_context& ctx, const std::string& to, const std::string& function, const Args&... args) {
  return rref_detail::split_timeout(ctx.this_node().default_timeout(), [&](std::chrono::milliseconds timeout, const auto&... a) {
    return rref<T>(ctx.remote(to, function, rref_detail::encoder(a...), timeout));
  }, args...);
}

/// An owner-local RRef holding (a copy of) `value` as a live object. A tensor stays the same
/// tensor: local_value returns it, and a to_here on another worker records its gradient path.
template <class T>
rref<T> make_rref(rref_context& ctx, const T& value) {
  if constexpr (std::is_copy_constructible_v<T>) {
    return rref<T>(ctx.make_local(rpc::hold<T>(value)));
  } else {
    return rref<T>(ctx.make_local(rpc::encode_result<T>(rref_detail::stored_context, value)));  // not part of any message
  }
}

/// rpc_async through the context; take a result that holds RRefs with get_bound(). `args` may
/// end with a timeout (rpc/api.hpp). RRefs it carries are probed if the call fails, so a lost
/// call does not leak them (Note [RRef protocol]).
template <class R, class... Args>
rpc::future<R> rpc_async(rref_context& ctx, const std::string& to, const std::string& function, const Args&... args) {
  return rref_detail::split_timeout(ctx.this_node().default_timeout(), [&](std::chrono::milliseconds timeout, const auto&... a) {
    return rref_detail::probed_call<R>(ctx.shared_impl(), to, [&](rref_detail::send_scope& sent) {
      return rref_detail::call_node<R>(ctx.this_node(), to, function, timeout, sent, a...);
    });
  }, args...);
}

/// The older form, deadline first.
template <class R, class... Args>
rpc::future<R> rpc_async(rref_context& ctx, const std::string& to, const std::string& function, rpc::deadline d, const Args&... args) {
  return rpc_async<R>(ctx, to, function, args..., d);
}

/// future::get() with the RRefs in the result bound to `ctx`. Blocks like get().
template <class R>
R get_bound(rref_context& ctx, const rpc::future<R>& f) {
  rref_detail::binding_scope scope(&ctx.impl());
  return f.get(scope);
}

/// rpc_sync through the context: RRefs in the result are bound to it; `args` may end with a
/// timeout. Blocks; throws like rpc_sync.
template <class R, class... Args>
R rpc_sync(rref_context& ctx, const std::string& to, const std::string& function, const Args&... args) {
  return get_bound(ctx, rpc_async<R>(ctx, to, function, args...));
}

/// The older form, deadline first.
template <class R, class... Args>
R rpc_sync(rref_context& ctx, const std::string& to, const std::string& function, rpc::deadline d, const Args&... args) {
  return get_bound(ctx, rpc_async<R>(ctx, to, function, d, args...));
}

}  // namespace troupe
