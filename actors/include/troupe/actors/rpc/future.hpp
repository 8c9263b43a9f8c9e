#pragma once
/// \file future.hpp
/// The result of an RPC: `future<R>` with wait(timeout), get(), then() (which chains), is_ready(),
/// wait_all and collect_all. A call always completes (result, error, its deadline, or its peer's
/// death), so get() never hangs; it blocks the calling user thread, never an actor.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "troupe/actors/flight_recorder.hpp"
#include "troupe/actors/rpc/codec.hpp"
#include "troupe/actors/rpc/interceptor.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::rpc {

namespace detail {

class blame_board;  // src/rpc/blame_board.hpp

/// Lets the thread that waits for a call help complete it (Note [direct channel]: a waiting caller
/// reads its own response). One per connection, told which call (`unattended` by id).
class call_helper {
 public:
  using clock = std::chrono::steady_clock;
  virtual ~call_helper() = default;
  /// Runs on a waiting thread before it blocks; returns once `st` completed or it cannot help.
  virtual void wait(const class call_state& st, clock::time_point until) = 0;
  /// A continuation was registered on call `id`, not yet complete: nobody may wait for it.
  virtual void unattended(std::uint64_t id) = 0;
};

/// Shared state of one call, completed exactly once by the agent (or the node on shutdown).
class call_state {
 public:
  using clock = std::chrono::steady_clock;
  /// Runs a continuation off the completing thread (the node's executor); false: it cannot.
  using poster = std::function<bool(std::function<void()>)>;
  /// A call of `function` on worker `to` from worker `from` (what() names it so, for errors).
  /// `post` (one per node, shared) runs continuations off the completing thread. `work` (the
  /// node's executor, or null) is told before a thread blocks on the call (Note [predicted quick]).
  call_state(std::string function, std::string to, std::string from, clock::time_point deadline, std::shared_ptr<const poster> post,
             std::shared_ptr<const long_work_notice> work = nullptr)
      : function_(std::move(function)), to_(std::move(to)), from_(std::move(from)), deadline_(deadline), post_(std::move(post)),
        work_(std::move(work)) {}
  /// Hands the response payload to the recycler, if one was set.
  ~call_state();
  call_state(const call_state&) = delete;
  call_state& operator=(const call_state&) = delete;

  /// Completes the call; later completions are ignored. Returns whether this one won. `meta`:
  /// the response's interceptor bytes (Note [call interceptor]).
  bool complete(errc code, std::string message, std::vector<char> payload, std::vector<char> meta = {});
  /// A state completed on this side (a continuation's result, collect_all's values): this
  /// call's name with " (<step>)" appended, its workers and executor, bounded by `deadline`.
  std::shared_ptr<call_state> derive(const std::string& step, clock::time_point deadline) const;
  /// Completes with a value made on this side: get() returns it without decoding (the state
  /// acts as an intercepted call whose value was decoded). Returns whether this one won.
  bool complete_value(std::shared_ptr<void> value);
  /// Attaches the caller's interceptor scope (before the request is sent); the result is then
  /// decoded once, under it, by decode_once.
  void set_scope(std::shared_ptr<call_scope> scope);
  /// Whether a call scope was attached.
  bool intercepted() const { return intercepted_; }
  /// For an intercepted call: the first caller runs `decode(payload, scope)` inside the scope's
  /// guard, after scope->on_meta(response meta); `decode` puts the scope in its codec context.
  /// Every caller gets that value (or its exception). Call only after value() succeeded.
  std::shared_ptr<void> decode_once(const std::function<std::shared_ptr<void>(const std::vector<char>&, call_scope*)>& decode);
  /// Blocks until complete or `timeout` passed; returns whether complete.
  bool wait_for(std::chrono::milliseconds timeout) const;
  /// Whether complete; on a pending call with a helper, tells it nobody waits (see set_helper).
  bool ready() const;
  /// Whether complete, without telling the helper anything.
  bool done() const;
  /// Blocks until complete (bounded by the deadline plus a grace period) and returns the bytes,
  /// or throws the call's troupe::error.
  const std::vector<char>& value() const;
  /// The owner of value()'s bytes when they are large enough for tensors to view them (Note
  /// [adopted payload] in codec.hpp), else null. Call only after value() succeeded.
  std::shared_ptr<const void> payload_owner() const { return shared_payload_; }
  /// Adds a continuation, run on the executor once complete (at once if already complete).
  void on_complete(std::function<void()> fn);
  /// Adds a continuation run on the completing thread itself (at once on this thread if already
  /// complete). It must neither block nor throw (it may run on an I/O or CAF thread).
  void on_complete_inline(std::function<void()> fn);
  /// Lets the thread that waits for this call help complete it (call_helper, which knows it as
  /// `id`). Set before the call is shared.
  void set_helper(std::shared_ptr<call_helper> helper, std::uint64_t id);
  /// Note [rpc device map]: CUDA results come back by `reverse` (the inverse of the caller's
  /// map for the callee). Set before the call is shared.
  void set_result_map(std::map<int, int> reverse) { result_map_ = std::move(reverse); }
  const std::map<int, int>& result_map() const { return result_map_; }
  /// The worker the call went to.
  const std::string& callee() const { return to_; }
  /// Keeps `held` (the sources of CUDA arguments sent by IPC handle) alive until the call
  /// completes. Set before the request is sent.
  void hold_until_complete(std::vector<std::shared_ptr<const void>> held);
  /// "call to 'f' on worker1 from worker0", for error messages (made when asked).
  std::string what() const { return "call to '" + function_ + "' on " + to_ + " from " + from_; }
  clock::time_point deadline() const { return deadline_; }
  /// `recycle` gets the response payload's buffer when this state dies (Note [byte pool] in
  /// src/rpc/byte_pool.hpp). Set before complete().
  void set_recycler(std::function<void(std::vector<char>&&)> recycle);
  /// Ends the recorded operation `token` of `recorder` when the call completes (Note [flight
  /// recorder]). Set before the call is shared.
  void set_trace(std::shared_ptr<flight_recorder> recorder, std::uint64_t token);
  /// A timeout of this call appends the hang report `board` holds for call `seq` (Note [rpc
  /// blame]). Set before the call is shared.
  void set_blame(std::shared_ptr<const blame_board> board, std::uint64_t seq);

 private:
  /// `message` of a timeout, with the hang report of this call appended when one was made.
  std::string with_blame(std::string message) const;
  /// Appends `fn` to `list` (and tells the helper) unless complete; false: complete, `fn` untouched.
  bool queue_if_pending(std::vector<std::function<void()>>& list, std::function<void()>& fn);

  void help_wait(clock::time_point until) const;
  std::string function_, to_, from_;
  clock::time_point deadline_;
  std::shared_ptr<const poster> post_;
  std::shared_ptr<const long_work_notice> work_;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  std::atomic<bool> completed_{false};  // done_, readable without the lock
  errc code_ = errc::ok;
  std::string message_;
  std::vector<char> payload_;
  // A payload of adopt_min_bytes or more, held apart so that tensors viewing it keep only it
  // alive (Note [adopted payload] in codec.hpp). value() is then this one.
  std::shared_ptr<std::vector<char>> shared_payload_;
  std::vector<std::function<void()>> continuations_;
  std::vector<std::function<void()>> inline_continuations_;
  std::shared_ptr<call_helper> helper_;
  std::uint64_t helper_id_ = 0;
  std::map<int, int> result_map_;
  std::vector<std::shared_ptr<const void>> held_;
  std::function<void(std::vector<char>&&)> recycle_;
  std::shared_ptr<flight_recorder> recorder_;
  std::uint64_t trace_token_ = 0;
  std::shared_ptr<const blame_board> blame_;
  std::uint64_t blame_seq_ = 0;
  // Note [call interceptor]: the caller's scope and the response's meta; decoded at most once.
  bool intercepted_ = false;
  std::shared_ptr<call_scope> scope_;
  std::vector<char> meta_;
  std::mutex decode_mutex_;
  bool decoded_ = false;
  std::shared_ptr<void> decoded_value_;
  std::exception_ptr decode_error_;
};

/// Completes `st` with what `make()` returns, or with the exception it throws: a troupe::error
/// keeps its code, another exception becomes remote_exception. Never throws.
template <class U, class Make>
void complete_with(call_state& st, Make&& make) noexcept {
  try {
    if constexpr (std::is_void_v<U>) {
      make();
      st.complete_value(nullptr);
    } else {
      st.complete_value(std::make_shared<U>(make()));
    }
  } catch (const error& e) {
    st.complete(e.code(), e.message(), {});
  } catch (const std::exception& e) {
    st.complete(errc::remote_exception, "the continuation of " + st.what() + " threw: " + e.what(), {});
  } catch (...) {
    st.complete(errc::remote_exception, "the continuation of " + st.what() + " threw a non-standard exception", {});
  }
}

}  // namespace detail

template <class R>
class future;

/// What collect_all of futures of R yields: the values in order (nothing for R = void).
template <class R>
using collected_t = std::conditional_t<std::is_void_v<R>, void, std::vector<R>>;

/// A future of every future's value, in the order of `fs`. It completes once all of them
/// completed, with their values. Or it completes with the error of the first one (in `fs` order)
/// that failed. Like torch.futures.collect_all followed by reading each value. get() on it waits
/// up to the latest deadline of `fs` plus `budget`. Never blocks; throws invalid_state when one
/// of `fs` is empty. An empty `fs` gives a completed future of no values.
template <class R>
future<collected_t<R>> collect_all(std::vector<future<R>> fs, std::chrono::milliseconds budget = std::chrono::seconds(60));

/// The future result of an RPC. Copyable handle to shared state; thread-safe.
template <class R>
class future {
 public:
  future() = default;
  explicit future(std::shared_ptr<detail::call_state> st) : st_(std::move(st)) {}

  /// Whether the call has completed (with a value or an error). Never blocks.
  bool is_ready() const { return st_ && st_->ready(); }
  /// Blocks the caller up to `timeout`; returns whether the call completed.
  bool wait(std::chrono::milliseconds timeout) const { return st_ && st_->wait_for(timeout); }
  /// Blocks until the call completes and returns its value, or throws its troupe::error. The
  /// code is timeout, peer_lost, unknown_function, bad_argument, remote_exception,
  /// protocol_violation, or that of an exception the call interceptor threw. With an interceptor,
  /// only the first get() decodes the result; later ones return copies of it. The first get()
  /// moves a move-only result out; later ones return a moved-from value.
  R get() const { return get_under(nullptr); }
  /// get() with the handles in the result (RRefs) decoded under `handles` (Note [codec context]).
  /// The first decoding get() of an intercepted call decides how they are decoded.
  R get(handle_scope& handles) const { return get_under(&handles); }
  /// Runs `fn(future<R>)` on the node's executor once the call completes. It never runs on a CAF
  /// thread, and never inline in the agent. Returns the future of what `fn` returns, like
  /// torch's Future.then. That future completes with fn's value, or with the error fn threw.
  /// A troupe::error keeps its code; any other exception becomes remote_exception with its text.
  /// So this call's error reaches the returned future when `fn` calls get(). get() on the
  /// returned future waits up to this call's deadline plus `budget` for `fn` to finish (then
  /// errc::timeout). Chains: f.then(a).then(b). Throws invalid_state on an empty future.
  template <class F>
  auto then(F fn, std::chrono::milliseconds budget = std::chrono::seconds(60)) const
      -> future<std::decay_t<std::invoke_result_t<F&, future&>>> {
    using U = std::decay_t<std::invoke_result_t<F&, future&>>;
    if (!st_) throw error(errc::invalid_state, "then() on an empty rpc future");
    auto next = st_->derive("then", std::max(st_->deadline(), detail::call_state::clock::now()) + budget);
    st_->on_complete([self = *this, next, fn = std::move(fn)]() mutable {
      detail::complete_with<U>(*next, [&]() -> U { return fn(self); });
    });
    return future<U>(std::move(next));
  }
  /// Runs `fn(future<R>)` on the thread that completes the call: an I/O thread, a CAF thread,
  /// or a caller reading its own response. If the call is already complete, it runs at once on
  /// this thread. For continuations that only hand the result on (send a CAF message, notify).
  /// `fn` must not block and must not throw. It should not call get() when the call is
  /// intercepted: the decode would run on that thread.
  template <class F>
  void then_inline(F fn) const {
    if (!st_) throw error(errc::invalid_state, "then_inline() on an empty rpc future");
    future self = *this;
    st_->on_complete_inline([self, fn = std::move(fn)]() mutable { fn(self); });
  }

 private:
  R get_under(handle_scope* handles) const {
    if (!st_) throw error(errc::invalid_state, "get() on an empty rpc future");
    const auto& bytes = st_->value();
    const detail::result_devices devices(st_->result_map(), st_->callee());  // Note [rpc device map]
    codec_context ctx;  // Note [codec context]
    ctx.results = &devices;
    ctx.handles = handles;
    if (st_->intercepted()) {  // decoded once, under the call's scope (Note [call interceptor])
      auto v = st_->decode_once([this, &ctx](const std::vector<char>& b, call_scope* scope) -> std::shared_ptr<void> {
        ctx.scope = scope;
        if constexpr (std::is_void_v<R>) return nullptr;
        else return std::make_shared<R>(decode_result<R>(ctx, b, [this] { return st_->what(); }));
      });
      if constexpr (!std::is_void_v<R>) {
        auto p = std::static_pointer_cast<R>(v);
        if constexpr (std::is_copy_constructible_v<R>) return *p;
        else return std::move(*p);  // a move-only result (an rref) is taken by the first get()
      } else {
        return;
      }
    }
    if constexpr (std::is_void_v<R>) {
      (void)bytes;
    } else {
      const detail::payload_keeper keep(bytes, st_->payload_owner());  // Note [adopted payload] (codec.hpp)
      ctx.keeper = &keep;
      return decode_result<R>(ctx, bytes, [this] { return st_->what(); });
    }
  }
  template <class T>
  friend future<collected_t<T>> collect_all(std::vector<future<T>> fs, std::chrono::milliseconds budget);
  std::shared_ptr<detail::call_state> st_;
};

/// Waits for every future up to `timeout` in total; returns whether all completed.
template <class R>
bool wait_all(const std::vector<future<R>>& fs, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (const auto& f : fs) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
    if (!f.wait(left.count() > 0 ? left : std::chrono::milliseconds(0))) return false;
  }
  return true;
}

template <class R>
future<collected_t<R>> collect_all(std::vector<future<R>> fs, std::chrono::milliseconds budget) {
  using U = collected_t<R>;
  using clock = detail::call_state::clock;
  auto all = std::make_shared<std::vector<future<R>>>(std::move(fs));
  auto latest = clock::now();
  for (const auto& f : *all) {
    if (!f.st_) throw error(errc::invalid_state, "collect_all() of an empty rpc future");
    latest = std::max(latest, f.st_->deadline());
  }
  if (all->empty()) {
    auto done = std::make_shared<detail::call_state>("collect_all", "no worker", "this worker", latest, nullptr);
    detail::complete_with<U>(*done, [] { return U(); });
    return future<U>(std::move(done));
  }
  auto out = all->front().st_->derive("collect_all of " + std::to_string(all->size()), latest + budget);
  auto left = std::make_shared<std::atomic<std::size_t>>(all->size());
  for (const auto& f : *all)
    f.st_->on_complete([all, out, left] {
      if (left->fetch_sub(1) != 1) return;  // the last one to complete collects
      detail::complete_with<U>(*out, [&]() -> U {
        if constexpr (std::is_void_v<R>) {
          for (const auto& g : *all) g.get();
        } else {
          U values;
          values.reserve(all->size());
          for (const auto& g : *all) values.push_back(g.get());
          return values;
        }
      });
    });
  return future<U>(std::move(out));
}

}  // namespace troupe::rpc
