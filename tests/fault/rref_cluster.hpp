#pragma once
// An in-process job of N nodes for the RRef tests: one actor system each, real loopback TCP
// between them. It has one rref_context per node and one switchable fault injector shared by all.

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "integration/node_harness.hpp"
#include "troupe/actors/fault_plan.hpp"
#include "troupe/actors/rref/rref.hpp"

namespace troupe::test {

/// Forwards to the current fault_injector (none: pass-through); lets one cluster run many plans.
class switch_hook : public transport_hook {
 public:
  void use(std::shared_ptr<fault_injector> inj) {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = std::move(inj);
  }
  transport_decision on_send(envelope& m) override {
    auto c = get();
    return c ? c->on_send(m) : transport_decision{};
  }
  transport_decision on_receive(envelope& m) override {
    auto c = get();
    return c ? c->on_receive(m) : transport_decision{};
  }
  void on_point(const std::string& worker, const std::string& point, std::int64_t step) override {
    if (auto c = get()) c->on_point(worker, point, step);
  }

 private:
  std::shared_ptr<fault_injector> get() {
    std::lock_guard<std::mutex> lock(mutex_);
    return current_;
  }
  std::mutex mutex_;
  std::shared_ptr<fault_injector> current_;
};

/// N nodes named worker0..worker{N-1}, each with its rref_context.
struct cluster {
  std::shared_ptr<switch_hook> hook = std::make_shared<switch_hook>();
  std::vector<std::unique_ptr<node>> nodes;
  std::vector<std::unique_ptr<rref_context>> ctx;

  /// `setup` (may be empty) completes each node's options (a layer's message types).
  explicit cluster(int n, rref_options ro = {}, const std::function<void(node_options&)>& setup = {}) {
    for (int r = 0; r < n; ++r) {
      auto o = test::test_options(r, n, r == 0 ? 0 : nodes[0]->port(), "rref-test");
      o.executor_threads = 6;
      o.default_timeout = std::chrono::seconds(5);
      if (setup) setup(o);
      nodes.push_back(std::make_unique<node>(o, rpc::registry{}, hook));
    }
    if (ro.result_probe_after.count() == 0) ro.result_probe_after = std::chrono::milliseconds(1500);
    for (auto& nd : nodes) ctx.push_back(std::make_unique<rref_context>(*nd, ro));
  }
  ~cluster() {
    ctx.clear();
    for (auto& nd : nodes) nd->shutdown(shutdown_mode::immediate);
  }
  rref_context& operator[](int i) { return *ctx[static_cast<std::size_t>(i)]; }
  static std::string name(int i) { return "worker" + std::to_string(i); }

  /// Waits until every context is quiescent (no user fork, no message in flight, no owner).
  bool quiescent(std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (auto& c : ctx) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (!c->wait_quiescent(std::max(left, std::chrono::milliseconds(0)), false)) return false;
    }
    for (auto& c : ctx) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (!c->wait_quiescent(std::max(left, std::chrono::milliseconds(0)), true)) return false;
    }
    return true;
  }
  /// Every leak of every context, one line each.
  std::string leaks() const {
    std::string out;
    for (const auto& c : ctx)
      for (const auto& l : c->leaks()) out += c->name() + ": " + l + "\n";
    return out;
  }
};

}  // namespace troupe::test
