#pragma once
// When an ordinary function's request is run as a quick job (Note [predicted quick] in
// executor.hpp). It holds the prediction from its recent runs, and the budget of one read.

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "executor.hpp"
#include "troupe/actors/rpc/registry.hpp"

namespace troupe::detail {

// Note [predicted quick] (executor.hpp): a function is run as a quick job once its last
// predict_after runs each took under short_run. It stays one only while the quick jobs of one
// read are expected to take no more than short_run together. So the leader serves a read of
// many tiny requests in one go. Requests of tens of microseconds that arrive together still go
// to followers, in parallel on a machine with the cores for it.
constexpr auto short_run = std::chrono::microseconds(50);
constexpr std::uint32_t predict_after = 16;

// Whether a request for `h` joins the quick jobs of `read` (and counts it there).
inline bool predicted_short(const rpc::run_history& h, led_jobs& read) {
  if (h.short_streak.load(std::memory_order_relaxed) < predict_after) return false;
  const std::uint64_t expect = h.recent_ns.load(std::memory_order_relaxed);
  if (read.predicted_ns + expect > static_cast<std::uint64_t>(std::chrono::nanoseconds(short_run).count())) return false;
  read.predicted_ns += expect;
  return true;
}

inline void record_run(rpc::run_history& h, std::chrono::steady_clock::duration took) {
  const auto ns = static_cast<std::uint32_t>(std::min<std::int64_t>(std::chrono::nanoseconds(took).count(), 1'000'000'000));
  const std::uint32_t before = h.recent_ns.load(std::memory_order_relaxed);
  h.recent_ns.store(std::max(ns, before - before / 8), std::memory_order_relaxed);
  if (took < short_run) {
    if (h.short_streak.load(std::memory_order_relaxed) < predict_after) h.short_streak.fetch_add(1, std::memory_order_relaxed);
  } else {
    h.short_streak.store(0, std::memory_order_relaxed);
  }
}

}  // namespace troupe::detail
