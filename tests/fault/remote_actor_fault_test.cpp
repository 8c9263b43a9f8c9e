// Remote actor messages under each fault plan (Note [remote actors], "Faults"): the plan applies
// to actor messages as to RPC; CAF's semantics then decide what the sender sees.
#include <catch2/catch.hpp>

#include "integration/actor_child.hpp"
#include "troupe/actors/fault_plan.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;
using namespace troupe::test;
using troupe::errc;

namespace {

// Rank 0 under `plan` (faults on its sends), rank 1 the actor child.
struct faulted {
  explicit faulted(const std::string& plan)
      : children(troupe::spawn(1, [this](int) { actor_child(pipe); })),
        hook(std::make_shared<troupe::fault_injector>(troupe::fault_plan::parse(plan))),
        n(actor_options(0, 2, 0), {}, hook) {
    pipe.publish(n.port(), 1);
    echo = troupe::lookup_actor(n, "worker1", "echo", 10s);
  }
  ~faulted() {
    echo = nullptr;
    try {
      release_children(n);
      children.join(20s);
    } catch (...) {
    }
  }
  // One request from a fresh scoped actor (a duplicate's second response goes nowhere).
  caf::expected<std::int32_t> add_one(std::int32_t x, std::chrono::milliseconds timeout) {
    caf::scoped_actor self{n.system()};
    caf::expected<std::int32_t> out{caf::sec::unexpected_response};
    self->request(echo, timeout, x).receive([&](std::int32_t r) { out = r; }, [&](caf::error& e) { out = e; });
    return out;
  }
  std::pair<std::int64_t, std::int64_t> count() {
    caf::scoped_actor self{n.system()};
    std::pair<std::int64_t, std::int64_t> out{-1, -1};
    self->request(echo, 10s, count_atom::value).receive([&](std::int64_t c, std::int64_t ooo) { out = {c, ooo}; }, [](caf::error&) {});
    return out;
  }
  port_pipe pipe;
  troupe::spawn_context children;
  std::shared_ptr<troupe::fault_injector> hook;
  troupe::node n;
  caf::actor echo;
};

}  // namespace

TEST_CASE("a dropped remote actor request times out and the next one is answered", "[actors][fault]") {
  faulted f("seed 1\nrule actor_message fail_first=1\n");
  auto first = f.add_one(1, 300ms);
  REQUIRE_FALSE(first);
  CHECK(first.error() == caf::sec::request_timeout);
  auto second = f.add_one(2, 5s);
  REQUIRE(second);
  CHECK(*second == 3);
}

TEST_CASE("duplicated remote actor messages are delivered twice and a request still gets one answer", "[actors][fault]") {
  faulted f("seed 2\nrule actor_message duplicate=1\n");
  auto r = f.add_one(10, 5s);
  REQUIRE(r);
  CHECK(*r == 11);
  {
    caf::scoped_actor self{f.n.system()};
    for (std::int64_t i = 0; i < 10; ++i) self->send(f.echo, note_atom::value, i);
  }
  // The count request is duplicated too; the first answer already counts every note (same order).
  CHECK(f.count().first == 20);
  CHECK(f.hook->counters().duplicated >= 11);
}

TEST_CASE("delayed remote actor messages arrive late and intact", "[actors][fault]") {
  faulted f("seed 3\nrule actor_message delay=30..40\n");
  const auto t0 = std::chrono::steady_clock::now();
  auto r = f.add_one(5, 5s);
  REQUIRE(r);
  CHECK(*r == 6);
  CHECK(std::chrono::steady_clock::now() - t0 >= 30ms);
}

TEST_CASE("reordered remote actor messages all arrive in some order", "[actors][fault]") {
  faulted f("seed 4\nrule actor_message reorder=30\n");
  {
    caf::scoped_actor self{f.n.system()};
    for (std::int64_t i = 0; i < 30; ++i) self->send(f.echo, note_atom::value, i);
  }
  // The count request may overtake notes: ask until all arrived (each ask is bounded).
  std::pair<std::int64_t, std::int64_t> c{0, 0};
  for (int i = 0; i < 50 && c.first < 30; ++i) c = f.count();
  CHECK(c.first == 30);
  WARN("out of order under reorder=30: " << c.second);
}

TEST_CASE("a rule for one actor message type drops its second message and leaves other types alone", "[actors][fault]") {
  // The key is CAF's name of the message's type, as the plan's author reads it from CAF.
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  const std::string type = sys.types().portable_name(caf::make_message(std::int32_t{0}).type(0));
  faulted f("seed 5\nrule actor:" + type + " nth=2\n");
  CHECK(f.count().first != -1);  // another type: answered
  auto first = f.add_one(1, 5s);
  REQUIRE(first);
  auto second = f.add_one(2, 300ms);
  REQUIRE_FALSE(second);
  CHECK(second.error() == caf::sec::request_timeout);
  auto third = f.add_one(3, 5s);
  REQUIRE(third);
  CHECK(*third == 4);
  CHECK(f.hook->counters().dropped_requests == 1);
}
