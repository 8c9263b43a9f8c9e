// Every node of a job connecting to every other at the same moment (Note [hello retry] in
// actors/src/peer_dialer.hpp). Pairs of processes dial each other at once, as the members of a
// new process group do. No connection waits out its deadline, no peer is lost, in any round.
#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "integration/node_harness.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/peer_events.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

constexpr int world = 9;   // rank 0 and eight ranks that meet in head-on pairs
constexpr int rounds = 8;  // fresh nodes each round: each pair meets once per round

// One round on one rank: every rank starts together, then watches (connects to) the others.
// Publishes "<slowest ms> <peers lost>[ errors]" under round<r>/ms/<rank> and returns it.
std::string connect_round(node& n, int round) {
  const auto prefix = "round" + std::to_string(round);
  n.store().barrier(prefix + "/go", n.info().rank, world, 20s);
  double slowest = 0;
  std::atomic<int> losses{0};
  std::string why;
  auto sub = peer_events::subscribe(n.peer_losses(), [&losses](const peer_loss&) { ++losses; });
  // Ranks 1 to 8 meet head on: in step k, rank r dials 1 + ((r - 1) xor k), which dials it.
  // Rank 0, which every rank dialled at start-up, dials them too.
  const int me = n.info().rank;
  for (int k = 1; k < world; ++k) {
    const int other = me == 0 ? k : 1 + ((me - 1) ^ k);
    if (other >= world) continue;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      n.peer_losses()->watch({"worker" + std::to_string(other)}, 10s);
    } catch (const error& e) {
      why += "; " + e.message();
    }
    slowest = std::max(slowest, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  auto line = std::to_string(slowest) + " " + std::to_string(losses.load()) + why;
  n.store().set(prefix + "/ms/" + std::to_string(me), line);
  return line;
}

// TCP sockets of this network namespace, in any state (TIME_WAIT included), whose remote port is
// `port`: the connections ever dialled to a listener there, for a minute after they close.
int sockets_to(std::uint16_t port) {
  int n = 0;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote;
      fields >> slot >> local >> remote;
      const auto colon = remote.rfind(':');
      if (colon != std::string::npos && std::stoul(remote.substr(colon + 1), nullptr, 16) == port) ++n;
    }
  }
  return n;
}

void child_rounds(int rank, troupe::test::port_pipe& pipe) {
  for (int r = 0; r < rounds; ++r) {
    troupe::node n(troupe::test::test_options(rank, world, pipe.read(20s)));
    connect_round(n, r);
    n.shutdown(shutdown_mode::graceful, 20s);
  }
}

}  // namespace

TEST_CASE("nodes that all connect to each other at the same moment never wait out the connect deadline",
          "[actors][integration][node]") {
  troupe::test::port_pipe pipe;
  auto children = spawn_children(world - 1, [&pipe](int c) { child_rounds(c + 1, pipe); });
  for (int r = 0; r < rounds; ++r) {
    troupe::node n(troupe::test::test_options(0, world, 0));
    pipe.publish(n.port(), world - 1);
    const auto prefix = "round" + std::to_string(r);
    std::vector<std::string> lines{connect_round(n, r)};
    for (int k = 1; k < world; ++k) lines.push_back(n.store().get(prefix + "/ms/" + std::to_string(k), 30s));
    n.shutdown(shutdown_mode::graceful, 20s);
    for (std::size_t k = 0; k < lines.size(); ++k) {
      INFO("round " << r << ", rank " << k << ": slowest connection in ms, peers lost, errors: " << lines[k]);
      const double ms = std::stod(lines[k]);
      CHECK(ms < 3000);  // a lost hello waited 10 s (the deadline); a retried one costs about 0.5 s
      CHECK(lines[k].find(' ') == lines[k].rfind(' '));  // no error text
      CHECK(lines[k].substr(lines[k].find(' ') + 1) == "0");  // no peer lost
    }
  }
  REQUIRE(children.join(60s));
}

// Note [greeted peers] in actors/src/peer_dialer.hpp: a dial to a peer that greeted us would
// open a redundant CAF connection, where CAF 0.17.6 can lose messages.
TEST_CASE("a node says hello back over the connection of a peer that greeted it and never dials that peer",
          "[actors][integration][node]") {
  auto n0 = std::make_unique<troupe::node>(troupe::test::test_options(0, 2, 0));
  auto n1 = std::make_unique<troupe::node>(troupe::test::test_options(1, 2, n0->port()));  // greets rank 0
  n1->functions().add("add", [](int a, int b) { return a + b; });
  const int before = sockets_to(n1->port());
  n0->peer_losses()->watch({"worker1"}, 10s);
  CHECK(troupe::rpc_sync<int>(*n0, "worker1", "add", 2, 3, 5s) == 5);
  CHECK(sockets_to(n1->port()) == before);
  n1->shutdown(shutdown_mode::immediate);
  n0->shutdown(shutdown_mode::immediate);
}
