// Remote CAF actors between namespace hosts. Every rank publishes an actor. Every rank reaches
// every other rank's actor by name with tensors in the messages. A monitor across hosts reports
// the actor's exit.
#include <caf/all.hpp>
#include <catch2/catch.hpp>

#include "multihost/rank_env.hpp"
#include "multihost/two_host_job.hpp"
#include "troupe/actors/remote_actor.hpp"
#include "troupe/tensors/elementwise.hpp"
#include "troupe/tensors/factories.hpp"
#include "troupe/tensors/generator.hpp"

using namespace std::chrono_literals;

namespace {

using scale_atom = caf::atom_constant<caf::atom("scale")>;

// Answers with its host and the tensor times two; quits on an exit message like any actor.
caf::behavior doubler(caf::event_based_actor*, std::string host) {
  return {[host](scale_atom, const troupe::tensor& t) { return caf::make_message(host, t * 2.0); }};
}

}  // namespace

TEST_CASE("remote actors cross hosts: requests with tensors reach every rank's actor and a monitor sees its exit", "[multihost][actors]") {
  troupe::test::netns_bed bed(2);
  troupe::test::require_bed(bed);
  const auto r = troupe::test::run_two_host_job(bed, troupe::test::rank_program("[.mh_actor_rank]"), 60s, {"--listen-addr=0.0.0.0"});
  INFO(r.all());
  CHECK(r.codes == std::vector<int>{0, 0});
  for (const auto& out : r.outputs) CHECK_THAT(out, Catch::Contains("All tests passed") && !Catch::Contains("failed"));
}

// One rank of the job above (hidden: run by the launcher only).
TEST_CASE("multihost actor rank: request every rank's actor, monitor the other host's", "[.mh_actor_rank]") {
  using troupe::test::worker;
  troupe::node n(troupe::test::rank_options());
  const int me = n.info().rank;
  REQUIRE(n.info().world_size == 4);
  {  // every handle and the scoped actor go before the node shuts down
    auto mine = n.system().spawn(doubler, troupe::test::this_host());
    troupe::publish_actor(n, mine, "doubler");
    n.store().barrier("published", me, 4, 30s);
    caf::scoped_actor self{n.system()};
    troupe::generator g(static_cast<std::uint64_t>(me + 1));
    const auto x = troupe::randn({1 << 18}, g);  // 1 MB: inline bytes between hosts
    for (int j = 0; j < 4; ++j) {
      auto peer = troupe::lookup_actor<caf::actor>(n, worker(j), "doubler", 10s);
      std::string host;
      troupe::tensor y;
      self->request(peer, 10s, scale_atom::value, x)
          .receive([&](const std::string& h, const troupe::tensor& t) { host = h, y = t; },
                   [&](caf::error& e) { FAIL("request to " << worker(j) << ": " << n.system().render(e)); });
      CHECK((host == troupe::test::this_host()) == (troupe::test::host_of(j) == troupe::test::host_of(me)));
      CHECK(troupe::equal(y, x * 2.0));
    }
    // The rank at the same place on the other host stops its actor; this rank's monitor sees it.
    const int peer_rank = (me + 2) % 4;
    auto peer = troupe::lookup_actor<caf::actor>(n, worker(peer_rank), "doubler", 10s);
    self->monitor(peer);
    n.store().barrier("monitoring", me, 4, 30s);
    self->send_exit(mine, caf::exit_reason::user_shutdown);
    bool down = false;
    self->receive([&](const caf::down_msg& d) { down = d.source == peer.address() && d.reason == caf::exit_reason::user_shutdown; },
                  caf::after(10s) >> [] {});
    CHECK(down);
  }
  troupe::test::finish_rank(n);
}
