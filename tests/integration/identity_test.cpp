// Worker identity (Note [worker identity] in rpc/roster.hpp) and the empty job token (Note
// [job token]).
#include <unistd.h>

#include <catch2/catch.hpp>

#include <optional>
#include <string>

#include "integration/node_harness.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;
using troupe::errc;

namespace {

// Starts a node with `o` and returns the error it was refused with (nothing if it started).
std::optional<troupe::error> refusal(const troupe::node_options& o) {
  try {
    troupe::node n(o);
  } catch (const troupe::error& e) {
    return e;
  }
  return std::nullopt;
}

bool says(const troupe::error& e, const std::string& text) { return e.message().find(text) != std::string::npos; }

}  // namespace

TEST_CASE("a second process claiming a live rank or name is refused on both sides and the real worker is still reached",
          "[actors][security]") {
  troupe::test::port_pipe real_pipe, impostor_pipe;
  // Child 0 is the real worker1; the others, started once it joined, claim its rank, its name,
  // or another world size.
  auto children = troupe::spawn(4, [&](int i) {
    if (i == 0) {
      troupe::node n(troupe::test::test_options(1, 3, real_pipe.read()));
      n.functions().add("pid", [] { return static_cast<int>(::getpid()); });
      n.store().set("ready/1", "1");
      n.store().get("done", 30s);
      n.shutdown(troupe::shutdown_mode::immediate);
      return;
    }
    auto o = troupe::test::test_options(1, 3, impostor_pipe.read());
    std::string expect = "rank 1 (worker1) is claimed";
    if (i == 2) {  // a free rank under a live name
      o.rank = 2;
      o.name = "worker1";
      expect = "worker1 (rank 1) is held by a live process";
    } else if (i == 3) {
      o.world_size = 4;
      expect = "claims world size 4";
    }
    auto e = refusal(o);
    if (!e) throw std::runtime_error("impostor " + std::to_string(i) + " was accepted");
    if (e->code() != errc::unauthorized || !says(*e, expect)) throw *e;
  });
  troupe::node n(troupe::test::test_options(0, 3, 0));
  real_pipe.publish(n.port(), 1);
  n.store().wait({"ready/1"}, 10s);
  const auto addr = n.store().get("troupe/addr/worker1", 5s);
  const int real = troupe::rpc_sync<int>(n, "worker1", "pid", 5s);
  impostor_pipe.publish(n.port(), 3);
  for (int k = 0; k < 3; ++k) CHECK(children.wait_any(30s).has_value());  // each exits 0 only if refused as expected
  CHECK(n.store().get("troupe/addr/worker1", 5s) == addr);  // not overwritten
  CHECK(troupe::rpc_sync<int>(n, "worker1", "pid", 5s) == real);
  n.store().set("done", "1");
  CHECK(children.join(10s));
  n.shutdown(troupe::shutdown_mode::immediate);
}

TEST_CASE("an empty job token is refused unless allowed on loopback", "[actors][security]") {
  auto o = troupe::test::test_options(0, 1, 0, "");
  auto e = refusal(o);
  REQUIRE(e);
  CHECK(e->code() == errc::unauthorized);
  CHECK(says(*e, "allow_empty_token"));
  o.listen_addr = "0.0.0.0";
  o.allow_empty_token = true;
  e = refusal(o);
  REQUIRE(e);
  CHECK(e->code() == errc::unauthorized);
  CHECK(says(*e, "0.0.0.0"));
  o.listen_addr = "127.0.0.1";
  CHECK_FALSE(refusal(o));
}

TEST_CASE("spawned children share a random job token", "[actors][security]") {
  ::unsetenv("TROUPE_JOB_TOKEN");
  troupe::test::port_pipe pipe;
  auto children = troupe::spawn(2, [&](int rank) {
    auto o = troupe::node_options::from_env();
    if (o.job_token.size() < 16) throw std::runtime_error("no random token: '" + o.job_token + "'");
    o.rank = rank;
    o.world_size = 2;
    if (rank == 1) o.master_port = pipe.read();
    troupe::node n(o);  // rank 1 joins only with rank 0's token
    if (rank == 0) pipe.publish(n.port(), 1);
    n.functions().add("one", [] { return 1; });
    n.shutdown(troupe::shutdown_mode::graceful, 20s);
  });
  CHECK(std::getenv("TROUPE_JOB_TOKEN") == nullptr);  // the parent's environment is untouched
  CHECK(children.join(40s));
}
