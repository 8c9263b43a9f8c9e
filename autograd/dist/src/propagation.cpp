// PropagateGradients (Note [FAST mode backward] in fast_engine.hpp): starting, waiting for and
// retrying the propagations a run started, and the handler on the receiving worker (deduplicated
// by (message, pass), answering with a typed state so error codes survive every hop).
#include <algorithm>
#include <thread>

#include "container_impl.hpp"
#include "fast_engine.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/tensors/error.hpp"

namespace troupe::dist_autograd {

// ---- PropagateGradients ------------------------------------------------------------------------

void start_propagation(node& n, const container_options& opts, propagation& p) {
  p.result = rpc_async<propagate_answer>(n, p.to, propagate_name, rpc::deadline{opts.propagate_timeout}, p.ctx, p.msg,
                                     p.pass, static_cast<std::int32_t>(p.attempt), p.grads, p.retain);
}

namespace {
/// The error of a failed propagation answer from `to`: peer_lost and timeout keep their code (a
/// worker lost hops away is still peer_lost here); anything else is a remote_exception.
error answer_error(const std::string& to, std::int32_t code, const std::string& text) {
  const auto c = static_cast<errc>(code);
  if (c == errc::peer_lost || c == errc::timeout) return error(c, text);
  return error(errc::remote_exception, "dist_autograd backward on " + to + ": " + text);
}
}  // namespace

void container::impl::drain(context_state& ctx, std::vector<propagation>& started) {
  std::exception_ptr first;
  auto fail = [&](const std::string& to, std::exception_ptr e, bool lost) {
    if (lost) {
      std::lock_guard<std::mutex> lock(ctx.m);
      ctx.lost.insert(to);
    }
    if (!first) first = e;
  };
  for (auto& p : started) {
    const auto give_up = std::chrono::steady_clock::now() + opts.backward_timeout;
    int failures = 0;
    for (;;) {
      try {
        const auto [state, code, text] = p.result.get();  // bounded by the attempt's deadline
        if (state == propagate_done) break;
        if (state == propagate_failed) {
          fail(p.to, std::make_exception_ptr(answer_error(p.to, code, text)), false);
          break;
        }
        if (std::chrono::steady_clock::now() > give_up) {  // still running there: poll again, bounded
          fail(p.to, std::make_exception_ptr(error(errc::timeout, "dist_autograd: the propagation of message " +
                                                                      std::to_string(p.msg) + " to " + p.to +
                                                                      " did not finish within backward_timeout")),
               false);
          break;
        }
      } catch (const error& e) {  // the attempt itself failed: lost request or reply, dead peer
        if (e.code() != errc::timeout || ++failures >= opts.attempts || std::chrono::steady_clock::now() >= give_up) {
          fail(p.to, std::current_exception(), e.code() == errc::peer_lost);
          break;
        }
      }
      std::this_thread::sleep_for(opts.backoff * (1 << std::min(p.attempt, 6)));  // backoff before the next attempt
      ++p.attempt;
      start_propagation(n, opts, p);
    }
  }
  started.clear();
  if (first) std::rethrow_exception(first);
}

void container::impl::run_propagation(context_state& ctx, message_id msg, std::uint64_t pass, const tensor_list& grads,
                                      bool retain) {
  std::shared_ptr<send_function> send;
  {
    std::lock_guard<std::mutex> lock(ctx.m);
    if (auto it = ctx.sends.find(msg); it != ctx.sends.end()) send = it->second;
  }
  if (!send)
    throw error(errc::bad_argument, "dist_autograd::propagate on " + n.info().name + ": no send function for message " +
                                        std::to_string(msg) + " in context " + std::to_string(ctx.id));
  if (grads.size() != send->next_edges().size())
    throw error(errc::bad_argument, "dist_autograd::propagate on " + n.info().name + ": " +
                                        std::to_string(grads.size()) + " gradients for a send of " +
                                        std::to_string(send->next_edges().size()) + " tensors");
  std::vector<propagation> started;
  std::exception_ptr err;
  try {
    execute_fast(ctx, pass, retain, send, grads, started);
  } catch (...) {
    err = std::current_exception();
  }
  try {
    drain(ctx, started);  // even after an error: nothing this run started is left behind
  } catch (...) {
    if (!err) err = std::current_exception();
  }
  if (err) std::rethrow_exception(err);
}

namespace {
/// The answer that carries the current exception's code and text.
propagate_answer failed_answer(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const error& err) {
    return {propagate_failed, static_cast<std::int32_t>(err.code()), err.message()};
  } catch (const std::exception& err) {
    return {propagate_failed, static_cast<std::int32_t>(errc::remote_exception), err.what()};
  } catch (...) {
    return {propagate_failed, static_cast<std::int32_t>(errc::remote_exception), "unknown exception"};
  }
}
}  // namespace

propagate_answer container::impl::on_propagate(context_id id, message_id msg, std::uint64_t pass,
                                               std::int32_t /*attempt*/, const tensor_list& grads, bool retain) {
  auto ctx = find_if(id);
  if (!ctx)
    return {propagate_failed, static_cast<std::int32_t>(errc::bad_argument),
            "dist_autograd::propagate: unknown context " + std::to_string(id) + " on " + n.info().name};
  std::shared_ptr<handled_propagation> h;
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(ctx->m);
    auto& slot = ctx->handled[{msg, pass}];
    if (!slot) {
      slot = std::make_shared<handled_propagation>();
      first = true;
    }
    h = slot;
  }
  if (!first) {  // a duplicate or a retry: the first one's outcome, or "still running"
    std::unique_lock<std::mutex> lock(h->m);
    if (!h->cv.wait_for(lock, opts.propagate_timeout / 2, [&] { return h->done; })) return {propagate_running, 0, {}};
    return h->error ? failed_answer(h->error) : propagate_answer{propagate_done, 0, {}};
  }
  std::exception_ptr err;
  try {
    run_propagation(*ctx, msg, pass, grads, retain);
  } catch (...) {
    err = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(h->m);
    h->done = true;
    h->error = err;
  }
  h->cv.notify_all();
  return err ? failed_answer(err) : propagate_answer{propagate_done, 0, {}};
}

}  // namespace troupe::dist_autograd
