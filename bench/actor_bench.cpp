// actor_bench: remote actor messages against the RPC path and raw TCP, in one run (BENCH.md).
//   remote request/response small round trip vs rpc_sync and raw TCP ping-pong;
//   one-way actor messages per second vs pipelined rpc_async;
//   a 64 MB tensor message round trip on one host vs the rpc 64 MB echo;
//   SIGKILL of a process to down_msg at a monitoring actor.
// Ranks: 0 measures, 1 hosts the echo actor and the rpc functions, 2 is the process killed.
//   actor_bench [--quick]
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <vector>

#include <caf/all.hpp>

#include "bench_node.hpp"
#include "bench_util.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/remote_actor.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/tensors/factories.hpp"

using namespace std::chrono_literals;
namespace tb = troupe::bench;

namespace {

using note_atom = caf::atom_constant<caf::atom("note")>;
using count_atom = caf::atom_constant<caf::atom("count")>;
using run_atom = caf::atom_constant<caf::atom("run")>;

// Raw TCP 1-byte ping-pong between this process and a forked echo child, in us.
std::vector<double> tcp_pingpong(int iters) {
  int sv[2];
  const int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(lfd, 1) != 0 ||
      ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len) != 0)
    return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int c = ::accept(lfd, nullptr, nullptr);
    char b = 0;
    while (::recv(c, &b, 1, 0) == 1 && ::send(c, &b, 1, 0) == 1) {
    }
    ::_exit(0);
  }
  sv[0] = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(sv[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::vector<double> out;
  if (::connect(sv[0], reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    char b = 1;
    for (int i = 0; i < iters + iters / 10; ++i) {
      const auto t0 = tb::clock::now();
      if (::send(sv[0], &b, 1, 0) != 1 || ::recv(sv[0], &b, 1, MSG_WAITALL) != 1) break;
      if (i >= iters / 10) out.push_back(tb::seconds_since(t0) * 1e6);
    }
  }
  ::close(sv[0]);
  ::close(lfd);
  ::waitpid(pid, nullptr, 0);
  return out;
}

troupe::node_options options(int rank, std::uint16_t port) {
  auto o = tb::bench_node_options(rank, 3, port);
  return o;
}

struct echo_state {
  std::int64_t notes = 0;
};
caf::behavior echo_actor(caf::stateful_actor<echo_state>* self) {
  return {
      [](std::int32_t x) { return x + 1; },
      [](const troupe::tensor& t) { return t; },
      [self](note_atom, std::int64_t) { ++self->state.notes; },
      [self](count_atom) { return self->state.notes; },
  };
}

void serve(int rank, std::uint16_t port) {
  troupe::rpc::registry fns;
  fns.add("inc", [](std::int32_t x) { return x + 1; });
  fns.add("echo", [](troupe::tensor t) { return t; });
  troupe::node n(options(rank, port), fns);
  auto echo = n.system().spawn(echo_actor);
  troupe::publish_actor(n, echo, "echo");
  n.store().set("ready/" + std::to_string(rank), "1");
  n.store().get("done", 10min);
  caf::anon_send_exit(echo, caf::exit_reason::user_shutdown);
  echo = nullptr;
  n.shutdown(troupe::shutdown_mode::immediate);
}

// An event-based driver: `iters` sequential requests to `to`, each timed (us) into `out`.
caf::behavior driver(caf::event_based_actor* self, caf::actor to, std::shared_ptr<std::vector<double>> out) {
  return {[=](run_atom, int left) -> caf::result<bool> {
    auto rp = self->make_response_promise<bool>();
    auto step = std::make_shared<std::function<void(int)>>();
    *step = [=](int n) mutable {
      if (n == 0) return rp.deliver(true), void();
      const auto t0 = tb::clock::now();
      self->request(to, 10s, std::int32_t{1}).then([=](std::int32_t) mutable {
        out->push_back(tb::seconds_since(t0) * 1e6);
        (*step)(n - 1);
      }, [=](caf::error& e) mutable { rp.deliver(e); });
    };
    (*step)(left);
    return rp;
  }};
}

double actor_rtt(troupe::node& n, const caf::actor& echo, int iters) {
  auto times = std::make_shared<std::vector<double>>();
  auto d = n.system().spawn(driver, echo, times);
  caf::scoped_actor self{n.system()};
  self->request(d, 60s, run_atom::value, iters / 10).receive([](bool) {}, [](caf::error&) {});
  times->clear();
  self->request(d, 120s, run_atom::value, iters).receive([](bool) {}, [](caf::error&) {});
  self->send_exit(d, caf::exit_reason::user_shutdown);
  return tb::summarize(*times).median;
}

double actor_sends_per_s(troupe::node& n, const caf::actor& echo, int msgs) {
  caf::scoped_actor self{n.system()};
  std::int64_t before = 0;
  self->request(echo, 10s, count_atom::value).receive([&](std::int64_t c) { before = c; }, [](caf::error&) {});
  const auto t0 = tb::clock::now();
  for (int i = 0; i < msgs; ++i) self->send(echo, note_atom::value, std::int64_t{i});
  std::int64_t got = 0;
  self->request(echo, 60s, count_atom::value).receive([&](std::int64_t c) { got = c; }, [](caf::error&) {});
  const double s = tb::seconds_since(t0);
  return got - before == msgs ? msgs / s : 0;
}

double rpc_async_per_s(troupe::node& n, int calls) {
  std::vector<troupe::rpc::future<std::int32_t>> fs;
  fs.reserve(calls);
  const auto t0 = tb::clock::now();
  for (int i = 0; i < calls; ++i) fs.push_back(troupe::rpc_async<std::int32_t>(n, "worker1", "inc", std::int32_t{i}));
  for (auto& f : fs) f.get();
  return calls / tb::seconds_since(t0);
}

double actor_tensor_gbps(troupe::node& n, const caf::actor& echo, const troupe::tensor& t, int iters) {
  std::vector<double> ms;
  for (int i = 0; i < iters + 1; ++i) {
    caf::scoped_actor self{n.system()};
    const auto t0 = tb::clock::now();
    bool ok = false;
    self->request(echo, 60s, t).receive([&](const troupe::tensor& r) { ok = r.nbytes() == t.nbytes(); }, [](caf::error&) {});
    if (ok && i > 0) ms.push_back(tb::seconds_since(t0) * 1e3);
  }
  return ms.empty() ? 0 : t.nbytes() / (tb::summarize(ms).median * 1e6);
}

double rpc_tensor_gbps(troupe::node& n, const troupe::tensor& t, int iters) {
  std::vector<double> ms;
  for (int i = 0; i < iters + 1; ++i) {
    const auto t0 = tb::clock::now();
    auto r = troupe::rpc_sync<troupe::tensor>(n, "worker1", "echo", t);
    if (r.nbytes() == t.nbytes() && i > 0) ms.push_back(tb::seconds_since(t0) * 1e3);
  }
  return ms.empty() ? 0 : t.nbytes() / (tb::summarize(ms).median * 1e6);
}

double down_after_kill_ms(troupe::node& n, troupe::spawn_context& children) {
  auto victim = troupe::lookup_actor(n, "worker2", "echo", 30s);
  caf::scoped_actor self{n.system()};
  self->monitor(victim);
  self->request(victim, 10s, std::int32_t{1}).receive([](std::int32_t) {}, [](caf::error&) {});
  const auto t0 = tb::clock::now();
  children.kill(1, SIGKILL);
  double ms = -1;
  self->receive([&](const caf::down_msg&) { ms = tb::seconds_since(t0) * 1e3; }, caf::after(10s) >> [] {});
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  tb::check_args(argc, argv, "actor_bench",
                 "Remote actor messages against rpc_sync, rpc_async, the rpc tensor echo and raw TCP, in one run.");
  const bool quick = tb::quick_mode(argc, argv);
  tb::report rep("actor");
  const double tcp = tb::summarize(tcp_pingpong(quick ? 2000 : 20000)).median;
  rep.add("limit_tcp_pingpong_median_us", tcp, "us");
  const std::uint16_t port = tb::free_loopback_port();
  auto children = troupe::spawn(2, [port](int i) { serve(i + 1, port); });
  try {
    troupe::node n(options(0, port));
    n.store().wait({"ready/1", "ready/2"}, 30s);
    auto echo = troupe::lookup_actor(n, "worker1", "echo", 30s);
    const int small = quick ? 2000 : 20000;
    std::vector<double> rpc_us;
    for (int i = 0; i < small + small / 10; ++i) {
      const auto t0 = tb::clock::now();
      troupe::rpc_sync<std::int32_t>(n, "worker1", "inc", std::int32_t{i});
      if (i >= small / 10) rpc_us.push_back(tb::seconds_since(t0) * 1e6);
    }
    const double rpc = tb::summarize(rpc_us).median;
    rep.add("limit_rpc_sync_small_rtt_median_us", rpc, "us", "\"iters\": " + std::to_string(small));
    const double actor = actor_rtt(n, echo, small);
    rep.add("actor_request_small_rtt_median_us", actor, "us", "\"iters\": " + std::to_string(small));
    rep.add("actor_request_rtt_ratio_to_rpc_sync", actor / rpc, "ratio", "\"goal\": 1.2");
    const int many = quick ? 20000 : 200000;
    const double async_rate = rpc_async_per_s(n, many);
    rep.add("limit_rpc_async_throughput_calls_per_s", async_rate, "calls/s", "\"calls\": " + std::to_string(many));
    const double send_rate = actor_sends_per_s(n, echo, many);
    rep.add("actor_send_throughput_msgs_per_s", send_rate, "calls/s", "\"msgs\": " + std::to_string(many));
    rep.add("actor_send_ratio_to_rpc_async", send_rate / async_rate, "ratio", "\"goal\": 1.0");
    const auto big = troupe::ones({std::int64_t{64} << 20}, troupe::tensor_options{troupe::dtype::uint8});
    const int rounds = quick ? 3 : 20;
    const double rpc_gbps = rpc_tensor_gbps(n, big, rounds);
    rep.add("limit_tensor_echo_64mb_gbps", rpc_gbps, "GB/s", "\"rounds\": " + std::to_string(rounds));
    const double actor_gbps = actor_tensor_gbps(n, echo, big, rounds);
    rep.add("actor_tensor_64mb_gbps", actor_gbps, "GB/s", "\"rounds\": " + std::to_string(rounds));
    rep.add("actor_tensor_64mb_ratio_to_rpc", actor_gbps / rpc_gbps, "ratio", "\"goal\": 0.9");
    echo = nullptr;
    rep.add("actor_down_after_kill_ms", down_after_kill_ms(n, children), "ms");
    n.store().set("done", "1");
    n.shutdown(troupe::shutdown_mode::immediate);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "actor_bench: %s\n", e.what());
    return 1;
  }
  rep.print_table();
  try {
    children.join(20s);
  } catch (const troupe::error&) {
    // rank 2 was SIGKILLed on purpose
  }
  return 0;
}
