// Shutdown hooks (Note [shutdown hooks]): what node::shutdown() runs before its actor system goes down.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <optional>

#include <caf/all.hpp>

#include "troupe/actors/node.hpp"

using namespace std::chrono_literals;
using namespace troupe;

namespace {

node_options solo() {
  node_options o;
  o.job_token = "t";
  o.default_timeout = 5s;
  o.join_timeout = 5s;
  return o;
}

}  // namespace

TEST_CASE("a node runs its shutdown hooks once, on a running actor system, and skips released ones", "[actors][node]") {
  node n(solo());
  std::atomic<int> ran{0};
  std::atomic<bool> system_ran{false};
  caf::actor worker = n.system().spawn([]() -> caf::behavior { return {[](int x) { return x + 1; }}; });
  auto kept = n.at_shutdown([&] {
    ++ran;
    // The system still runs: a request to an actor on it is answered.
    caf::scoped_actor self{n.system()};
    self->request(worker, caf::infinite, 41).receive([&](int y) { system_ran = (y == 42); }, [](caf::error&) {});
    self->send_exit(worker, caf::exit_reason::user_shutdown);
  });
  std::atomic<int> released_ran{0};
  {
    auto released = n.at_shutdown([&] { ++released_ran; });
  }
  auto reset = n.at_shutdown([&] { ++released_ran; });
  reset.reset();
  n.shutdown(shutdown_mode::immediate);
  n.shutdown(shutdown_mode::immediate);
  CHECK(ran == 1);
  CHECK(system_ran);
  CHECK(released_ran == 0);
  CHECK_THROWS_AS(n.at_shutdown([] {}), error);
}

TEST_CASE("a shutdown hook that throws does not stop the node's shutdown or the other hooks", "[actors][node]") {
  std::atomic<int> after{0};
  std::optional<shutdown_hook> a, b;
  {
    node n(solo());
    a = n.at_shutdown([] { throw error(errc::io_error, "boom"); });
    b = n.at_shutdown([&] { ++after; });
    n.shutdown(shutdown_mode::immediate);
  }
  CHECK(after == 1);
  a.reset();  // the node is gone: releasing its handles is still safe
  b.reset();
}
