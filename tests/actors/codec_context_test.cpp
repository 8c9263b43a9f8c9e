// Note [codec context]: what steers an encode travels in the context built for it. A served
// call's answer names its caller (reply_to); the arguments and answers of a nested call made on
// the same thread follow the nested call's own context.
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <catch2/catch.hpp>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"

using namespace std::chrono_literals;

namespace {

// A value that writes the reply_to of the context it is encoded under (self_coded).
struct reply_probe {
  std::string seen;
  void write_payload(troupe::rpc::detail::writer& w) const {
    const auto* to = w.context().reply_to;
    w.str(to ? *to : std::string("(none)"));
  }
  void read_payload(troupe::rpc::detail::reader& r) { r.str(seen); }
};

// Three nodes of one job in this process: worker0, worker1, worker2.
struct three_nodes {
  std::vector<std::unique_ptr<troupe::node>> n;
  three_nodes() {
    for (int r = 0; r < 3; ++r)
      n.push_back(std::make_unique<troupe::node>(troupe::test::test_options(r, 3, r == 0 ? 0 : n[0]->port(), "codec-context")));
  }
  ~three_nodes() {
    for (auto& x : n) x->shutdown(troupe::shutdown_mode::immediate);
  }
};

}  // namespace

TEST_CASE("a value encoded outside a served call has no reply_to", "[actors][codec]") {
  const auto bytes = troupe::rpc::encode_result(reply_probe{});
  CHECK(troupe::rpc::decode_result<reply_probe>(bytes, "probe").seen == "(none)");
}

TEST_CASE("a served call's answer names its caller, and a nested call on the same thread names its own", "[actors][codec]") {
  three_nodes j;
  j.n[2]->functions().add("who", [] { return reply_probe{}; });
  j.n[2]->functions().add("seen_in_arg", [](reply_probe p) { return p.seen; });
  auto& n1 = *j.n[1];
  j.n[1]->functions().add("relay", [&n1] {
    auto inner = troupe::rpc_sync<reply_probe>(n1, "worker2", "who", 10s);
    auto arg = troupe::rpc_sync<std::string>(n1, "worker2", "seen_in_arg", reply_probe{}, 10s);
    return std::make_tuple(inner.seen, arg, reply_probe{});
  });
  const auto [inner, arg, outer] = troupe::rpc_sync<std::tuple<std::string, std::string, reply_probe>>(*j.n[0], "worker1", "relay", 10s);
  CHECK(inner == "worker1");  // worker2's answer goes to worker1
  CHECK(arg == "(none)");     // an argument of worker1's own call is no answer
  CHECK(outer.seen == "worker0");
}
