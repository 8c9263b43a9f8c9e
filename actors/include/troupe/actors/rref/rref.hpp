#pragma once
/// \file rref.hpp
/// Remote references (Note [RRef protocol] in rref/context.hpp).
///
///   troupe::rref_context ctx(n);                                   // one per node
///   troupe::add_function(ctx, "make_vec", [](int k) { return std::vector<int>(k, 1); });
///   auto r = troupe::remote<std::vector<int>>(ctx, "worker1", "make_vec", 3);  // returns at once
///   std::vector<int> v = r.to_here(5s);                            // blocks up to 5 s
///   int n = troupe::rpc_sync<int>(ctx, "worker2", "count", r);     // rref as argument
///   auto ps = troupe::make_rref(ctx, parameter_server{});          // owner-local
///   ps.rpc_sync<double>("push", grads);                            // method on the owner
///
/// Functions that take or return RRefs are registered with add_function / add_method (which
/// bind received RRefs to the context) and called with the rref_context overloads of rpc_sync /
/// rpc_async, so the RRefs in their results are bound too.

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

/// A reference to a value of type T owned by one worker. Copies share one reference (one fork
/// on a user, one local ref on the owner); the last copy's destruction releases it (G1).
/// Thread-safe.
template <class T>
class rref {
 public:
  rref() = default;
  explicit rref(std::shared_ptr<rref_detail::handle> h) : h_(std::move(h)) {}

  /// The value, copied from the owner. Blocks up to `timeout`. Throws remote_exception (the user
  /// function threw), owner_lost (the owner died), timeout, invalid_state (unbound rref).
  T to_here(std::chrono::milliseconds timeout = std::chrono::seconds(10)) const {
    rref_detail::binding_scope scope(h().ctx.get());
    return rpc::decode_result<T>(rref_detail::fetch(h(), timeout), "to_here of rref " + h().id.str());
  }
  /// The value, on its owner only (never blocks). Throws invalid_state elsewhere or while the
  /// value does not exist yet; remote_exception if the function threw.
  T local_value() const {
    rref_detail::binding_scope scope(h().ctx.get());
    return rpc::decode_result<T>(rref_detail::local_value(h()), "local_value of rref " + h().id.str());
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
  /// its result. Throws like rpc_sync, with owner_lost when the owner died.
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
    rref_detail::send_scope scope(h().ctx.get(), h().owner);  // rrefs among the args are probed if the call fails
    auto f = troupe::rpc_async<R>(node_of(), h().owner, "troupe.rref.method." + name, h().id, args...);
    auto sent = scope.take();
    if (!sent.empty()) {
      std::weak_ptr<rref_detail::context_impl> weak = h().ctx;
      f.then([weak, to = h().owner, sent = std::move(sent)](const rpc::future<R>& done) mutable {
        try {
          (void)done.get();
        } catch (const error&) {
          if (auto c = weak.lock()) rref_detail::probe(*c, to, std::move(sent));
        }
      });
    }
    return f;
  }

  /// Calls the method `name` on the owner's value with remote() semantics: returns at once an
  /// rref<R> to its result, owned by this rref's owner.
  template <class R, class... A>
  rref<R> remote(const std::string& name, const A&... args) const {
    rref_detail::check_owner(h(), name.c_str());
    auto& c = *h().ctx;
    rref_detail::send_scope scope(&c, h().owner);
    auto bytes = rpc::encode_args<rref_id, rpc::detail::wire_t<A>...>(h().id, rpc::detail::wire_t<A>(args)...);
    return rref<R>(rref_detail::start_remote(c, h().owner, "troupe.rref.method." + name, std::move(bytes),
                                             node_of().default_timeout(), scope.take()));
  }

  /// Boost serialization: sending forks the reference, receiving binds it (Note [RRef protocol]).
  template <class Ar> void save(Ar& ar, unsigned) const {
    rref_msg::wire w = rref_detail::fork_for_send(h());
    ar << w;
  }
  template <class Ar> void load(Ar& ar, unsigned) {
    rref_msg::wire w;
    ar >> w;
    if (auto* c = rref_detail::current_context()) {
      h_ = rref_detail::bind(*c, w);
      return;
    }
    h_ = std::make_shared<rref_detail::handle>();
    h_->id = w.id;
    h_->owner = w.owner;
    h_->pending = std::move(w);
  }
  BOOST_SERIALIZATION_SPLIT_MEMBER()

  /// Binds an rref received outside a context (add_function does it). Internal.
  void bind_to(rref_detail::context_impl& c) {
    if (h_ && !h_->bound && !h_->pending.id.creator.empty()) h_ = rref_detail::bind(c, h_->pending);
  }

 private:
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

/// Registers the method `name` of T, callable through any rref<T> (rref::rpc_sync): `fn(T&,
/// args...)` runs on the owner under the RRef's lock, so it must not use RRefs of this node.
/// Must return a value.
template <class T, class F>
void add_method(rref_context& ctx, const std::string& name, F fn) {
  using sig = rpc::detail::signature<std::decay_t<F>>;
  using R = typename sig::result;
  auto call = [&ctx, fn = std::move(fn)](const rref_id& id, auto&&... args) -> R {
    R out{};
    ctx.with_value(id, ctx.this_node().default_timeout(), [&](std::vector<char>& bytes) {
      T obj = rpc::decode_result<T>(bytes, "method of rref " + id.str());
      out = fn(obj, args...);
      rref_detail::storing_scope storing;
      bytes = rpc::encode_result<T>(obj);
    });
    return out;
  };
  [&]<class Self, class... A>(std::tuple<Self, A...>*) {
    ctx.this_node().functions().add("troupe.rref.method." + name, [call](rref_id id, A... a) -> R { return call(id, a...); });
  }(static_cast<typename sig::args*>(nullptr));
}

/// Runs `function(args...)` on worker `to` and returns an rref<T> to its result at once. The
/// deadline bounds the call; a lost call is confirmed by retried fork requests.
template <class T, class... Args>
rref<T> remote(rref_context& ctx, const std::string& to, const std::string& function, rpc::deadline d, const Args&... args) {
  rref_detail::send_scope scope(&ctx.impl(), to);
  auto bytes = rpc::encode_args<rpc::detail::wire_t<Args>...>(rpc::detail::wire_t<Args>(args)...);
  return rref<T>(ctx.remote(to, function, std::move(bytes), d.value, scope.take()));
}

template <class T, class... Args>
rref<T> remote(rref_context& ctx, const std::string& to, const std::string& function, const Args&... args) {
  return remote<T>(ctx, to, function, rpc::deadline{ctx.this_node().default_timeout()}, args...);
}

/// An owner-local RRef holding `value`.
template <class T>
rref<T> make_rref(rref_context& ctx, const T& value) {
  rref_detail::storing_scope storing;
  return rref<T>(ctx.make_local(rpc::encode_result<T>(value)));
}

/// rpc_sync through the context: RRefs in the result are bound to it; if the call fails, the
/// RRefs it carried are probed so a lost call does not leak them (Note [RRef protocol]).
template <class R, class... Args>
R rpc_sync(rref_context& ctx, const std::string& to, const std::string& function, rpc::deadline d, const Args&... args) {
  rref_detail::send_scope scope(&ctx.impl(), to);
  auto f = rpc_async<R>(ctx.this_node(), to, function, d, args...);
  auto sent = scope.take();
  rref_detail::binding_scope bind(&ctx.impl());
  try {
    return f.get();
  } catch (const error&) {
    if (!sent.empty()) rref_detail::probe(ctx.impl(), to, std::move(sent));
    throw;
  }
}

template <class R, class... Args>
R rpc_sync(rref_context& ctx, const std::string& to, const std::string& function, const Args&... args) {
  return rpc_sync<R>(ctx, to, function, rpc::deadline{ctx.this_node().default_timeout()}, args...);
}

/// rpc_async through the context; take a result that holds RRefs with get_bound(). RRefs it
/// carries are probed if the call fails.
template <class R, class... Args>
rpc::future<R> rpc_async(rref_context& ctx, const std::string& to, const std::string& function, rpc::deadline d, const Args&... args) {
  rref_detail::send_scope scope(&ctx.impl(), to);
  auto f = rpc_async<R>(ctx.this_node(), to, function, d, args...);
  auto sent = scope.take();
  if (!sent.empty()) {
    std::weak_ptr<rref_detail::context_impl> weak = ctx.shared_impl();
    f.then([weak, to, sent = std::move(sent)](const rpc::future<R>& done) mutable {
      try {
        (void)done.get();
      } catch (const error&) {
        if (auto c = weak.lock()) rref_detail::probe(*c, to, std::move(sent));
      }
    });
  }
  return f;
}

template <class R, class... Args>
rpc::future<R> rpc_async(rref_context& ctx, const std::string& to, const std::string& function, const Args&... args) {
  return rpc_async<R>(ctx, to, function, rpc::deadline{ctx.this_node().default_timeout()}, args...);
}

/// future::get() with the RRefs in the result bound to `ctx`. Blocks like get().
template <class R>
R get_bound(rref_context& ctx, const rpc::future<R>& f) {
  rref_detail::binding_scope scope(&ctx.impl());
  return f.get();
}

}  // namespace troupe
