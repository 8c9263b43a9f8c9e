// RRef benchmark (../shared/BENCH.md). It measures:
//   - remote() + to_here() round trip against the small rpc_sync round trip measured in the
//     same run;
//   - create/fork/delete rates;
//   - owner memory per live RRef at 100,000;
//   - time for the owner to reach zero after release;
//   - control messages per RRef lifetime in each sharing scenario against the protocol's minimum.
// Two nodes in one process (two actor systems, loopback TCP between them); results are checked
// beside the timings.
#include <malloc.h>

#include <cstdio>
#include <cstdlib>

#include "bench_util.hpp"
#include "troupe/actors/rref/rref.hpp"

namespace tb = troupe::bench;
using namespace std::chrono_literals;
using troupe::rref;

namespace {

struct pair_of_nodes {
  std::vector<std::unique_ptr<troupe::node>> nodes;
  std::vector<std::unique_ptr<troupe::rref_context>> ctx;
  pair_of_nodes() {
    for (int r = 0; r < 2; ++r) {
      troupe::node_options o;
      o.rank = r;
      o.world_size = 2;
      o.master_port = r == 0 ? 0 : nodes[0]->port();
      o.job_token = "rref-bench";
      nodes.push_back(std::make_unique<troupe::node>(o));
    }
    for (auto& n : nodes) ctx.push_back(std::make_unique<troupe::rref_context>(*n));
    for (auto& c : ctx) {
      troupe::add_function(*c, "id", [](std::int64_t x) { return x; });
      troupe::add_function(*c, "take", [](rref<std::int64_t> r) { return r.is_owner() ? 1 : 0; });
      troupe::add_function(*c, "mint", [cp = c.get()](std::int64_t x) { return troupe::make_rref(*cp, x); });
    }
  }
  ~pair_of_nodes() {
    ctx.clear();
    for (auto& n : nodes) n->shutdown(troupe::shutdown_mode::immediate);
  }
  void settle() {
    for (auto& c : ctx)
      if (!c->wait_quiescent(30s, true)) {
        std::fprintf(stderr, "rref_bench: not quiescent:\n");
        for (const auto& l : c->leaks()) std::fprintf(stderr, "  %s\n", l.c_str());
        std::exit(1);
      }
  }
  std::uint64_t messages() const {
    std::uint64_t n = 0;
    for (const auto& c : ctx) {
      const auto s = c->stats();
      n += s.remote_calls + s.fork_requests + s.child_acks + s.user_deletes + s.fetches + s.retries + s.value_readies;
    }
    return n;
  }
};

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "rref_bench: wrong result: %s\n", what);
    std::exit(1);
  }
}

void round_trips(pair_of_nodes& p, tb::report& rep, int iters) {
  auto& user = *p.ctx[0];
  // Interleaved, so both see the same machine load.
  std::int64_t i = 0;
  std::vector<double> rpc_t, rr_t;
  for (int it = -200; it < iters; ++it) {
    auto t0 = tb::clock::now();
    ++i;
    check(troupe::rpc_sync<std::int64_t>(*p.nodes[0], "worker1", "id", i) == i, "rpc_sync echo");
    const double a = tb::seconds_since(t0);
    t0 = tb::clock::now();
    {
      ++i;
      auto r = troupe::remote<std::int64_t>(user, "worker1", "id", i);
      check(r.to_here(5s) == i, "to_here value");
    }
    const double b = tb::seconds_since(t0);
    if (it >= 0) {
      rpc_t.push_back(a);
      rr_t.push_back(b);
    }
  }
  const auto rpc = tb::summarize(rpc_t), rr = tb::summarize(rr_t);
  p.settle();
  const std::string params = "\"iters\": " + std::to_string(iters) + ", \"nodes\": \"2 in one process\"";
  rep.add("ref_rpc_sync_small_rtt_median_us", rpc.median * 1e6, "us", params);
  rep.add("remote_to_here_median_us", rr.median * 1e6, "us", params);
  rep.add("remote_to_here_p99_us", rr.p99 * 1e6, "us", params);
  rep.add("remote_to_here_vs_rpc_sync_ratio", rr.median / rpc.median, "ratio", params);
}

void rates(pair_of_nodes& p, tb::report& rep, int n) {
  auto& user = *p.ctx[0];
  auto t0 = tb::clock::now();
  {
    std::vector<rref<std::int64_t>> live;
    for (int i = 0; i < n; ++i) live.push_back(troupe::remote<std::int64_t>(user, "worker1", "id", std::int64_t{i}));
  }
  p.settle();
  rep.add("rref_create_delete_per_s", n / tb::seconds_since(t0), "calls/s", "\"n\": " + std::to_string(n));
  {
    auto shared = troupe::rpc_sync<rref<std::int64_t>>(user, "worker1", "mint", std::int64_t{6});
    t0 = tb::clock::now();
    for (int i = 0; i < n; ++i) check(troupe::rpc_sync<int>(user, "worker1", "take", shared) == 1, "fork to owner");
  }
  p.settle();
  rep.add("rref_fork_to_owner_and_release_per_s", n / tb::seconds_since(t0), "calls/s", "\"n\": " + std::to_string(n));
}

std::size_t heap_in_use() { return mallinfo2().uordblks; }

void memory(pair_of_nodes& p, tb::report& rep, int n) {
  auto& owner = *p.ctx[1];
  const std::string params = "\"live\": " + std::to_string(n) + ", \"value\": \"int64\"";
  {
    const auto before = heap_in_use();
    std::vector<rref<std::int64_t>> live;
    live.reserve(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) live.push_back(troupe::make_rref(owner, std::int64_t{i}));
    check(owner.owner_count() == static_cast<std::size_t>(n), "owner count");
    rep.add("bytes_per_live_rref", static_cast<double>(heap_in_use() - before) / n, "bytes", params + ", \"includes\": \"owner_rref actor + map entry + local handle\"");
  }
  check(owner.wait_quiescent(60s, true) && owner.owner_count() == 0, "owner-local rrefs deleted after their handles");
  std::vector<rref<std::int64_t>> users;
  users.reserve(static_cast<std::size_t>(n));
  const auto before = heap_in_use();
  for (int i = 0; i < n; ++i) users.push_back(troupe::remote<std::int64_t>(*p.ctx[0], "worker1", "id", std::int64_t{i}));
  check(users.back().to_here(30s) == n - 1, "last remote value");
  rep.add("bytes_per_live_remote_rref_both_sides", static_cast<double>(heap_in_use() - before) / n, "bytes",
          params + ", \"includes\": \"owner_rref actor + user_rref actor + map entries + handle, one process\"");
  check(p.ctx[0]->wait_quiescent(1ms, false) == false, "users alive");
  const auto t0 = tb::clock::now();
  users.clear();
  check(owner.wait_quiescent(60s, true), "owner reaches zero");
  rep.add("owner_zero_after_release_ms", tb::seconds_since(t0) * 1e3, "ms", "\"live\": " + std::to_string(n) + ", \"users\": 1");
  p.settle();
}

// Control messages (remote_call, fork_request, child_ack, user_delete, fetch, value_ready, retries) per RRef
// lifetime, against the minimum of the protocol note for the scenario.
void messages(pair_of_nodes& p, tb::report& rep, int k) {
  auto& user = *p.ctx[0];
  auto per = [&](const char* name, double minimum, const std::function<void()>& once) {
    p.settle();
    const auto before = p.messages();
    for (int i = 0; i < k; ++i) once();
    p.settle();
    rep.add(std::string("control_messages_per_rref_") + name, static_cast<double>(p.messages() - before) / k, "count", "\"lifetimes\": " + std::to_string(k));
    rep.add(std::string("min_control_messages_per_rref_") + name, minimum, "count");
  };
  // remote_call + fetch + user_delete.
  per("remote_to_here", 3, [&] { check(troupe::remote<std::int64_t>(user, "worker1", "id", std::int64_t{1}).to_here(5s) == 1, "value"); });
  // owner -> user as result: PyTorch's minimum is the user's delete (+ the fetch); this design adds
  // fork_request and child_ack so a lost or duplicated carrier cannot delete early.
  per("owner_to_user_to_here", 2, [&] {
    check(troupe::rpc_sync<rref<std::int64_t>>(user, "worker1", "mint", std::int64_t{2}).to_here(5s) == 2, "value");
  });
  // user -> owner as argument: remote_call + fetch + the owner's child_ack + user_delete.
  per("remote_then_user_to_owner_arg", 4, [&] {
    auto mine = troupe::remote<std::int64_t>(user, "worker1", "id", std::int64_t{3});
    check(mine.to_here(5s) == 3, "value");
    check(troupe::rpc_sync<int>(user, "worker1", "take", mine) == 1, "take");
  });
}

}  // namespace

int main(int argc, char** argv) {
  tb::check_args(argc, argv, "rref_bench",
                 "RRef round trips, rates, owner memory and control messages against their limits.",
                 {{"--round-trips-only", "", "only remote + to_here against rpc_sync (profiling)"}});
  const bool quick = tb::quick_mode(argc, argv);
  tb::report rep("rref");
  pair_of_nodes p;
  // --round-trips-only: only the remote + to_here vs rpc_sync phase, 20,000 iterations (profiling).
  const bool only = argc > 1 && std::string(argv[argc - 1]) == "--round-trips-only";
  round_trips(p, rep, only ? 20000 : quick ? 300 : 3000);
  if (only) {
    rep.print_table();
    return 0;
  }
  rates(p, rep, quick ? 300 : 3000);
  memory(p, rep, quick ? 10000 : 100000);
  messages(p, rep, quick ? 50 : 300);
  rep.print_table();
  return 0;
}
