// Remote actors and process failure (Note [remote actors]): a SIGKILLed or frozen process turns
// into down_msg, exit_msg and failed requests carrying peer_lost naming the worker.
#include <signal.h>

#include <future>
#include <map>
#include <vector>

#include <catch2/catch.hpp>

#include "integration/actor_child.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;
using namespace troupe::test;
using troupe::errc;

namespace {

// Waits for the down_msgs of every actor in `who`, in any order; their reasons as troupe errors
// (timeout: none came within `bound`).
std::map<caf::actor_addr, troupe::error> down_reasons(caf::scoped_actor& self, const std::vector<caf::actor_addr>& who,
                                                      std::chrono::milliseconds bound) {
  std::map<caf::actor_addr, troupe::error> out;
  for (const auto& w : who) out.emplace(w, troupe::error(errc::timeout, "no down_msg"));
  std::size_t got = 0;
  const auto end = std::chrono::steady_clock::now() + bound;
  while (got < who.size() && std::chrono::steady_clock::now() < end) {
    self->receive(
        [&](const caf::down_msg& d) {
          auto it = out.find(d.source);
          if (it == out.end()) return;
          it->second = as_error(d.reason);
          ++got;
        },
        caf::after(end - std::chrono::steady_clock::now()) >> [] {});
  }
  return out;
}

troupe::error down_reason(caf::scoped_actor& self, const caf::actor_addr& who, std::chrono::milliseconds bound) {
  return down_reasons(self, {who}, bound).at(who);
}

}  // namespace

TEST_CASE("a SIGKILLed process sends down_msg to monitors and exit_msg to links and fails open requests at once", "[actors][integration]") {
  port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { actor_child(pipe); });
  troupe::node n(actor_options(0, 2, 0));
  pipe.publish(n.port(), 1);
  auto& sys = n.system();
  {
    auto echo = troupe::lookup_actor(n, "worker1", "echo", 10s);
    caf::scoped_actor self{sys};
    self->monitor(echo);
    // A local actor linked to the remote one: it dies with it.
    auto linked = sys.spawn([echo](caf::event_based_actor* a) -> caf::behavior {
      a->link_to(echo);
      return {[](std::int32_t x) { return x; }};
    });
    self->monitor(linked);
    self->request(linked, 5s, std::int32_t{1}).receive([](std::int32_t) {}, [](caf::error&) {});  // its link is in place
    auto open = std::async(std::launch::async, [&] {
      std::string message;
      const auto code = code_of([&] {
        caf::scoped_actor asker{sys};
        caf::error err;
        asker->request(echo, std::chrono::seconds(30), hold_atom::value).receive([] {}, [&](caf::error& e) { err = e; });
        if (err) throw as_error(err);
      }, &message);
      return std::make_pair(code, message);
    });
    REQUIRE(open.wait_for(300ms) == std::future_status::timeout);  // the request is held by the actor
    const auto t0 = std::chrono::steady_clock::now();
    children.kill(0, SIGKILL);
    auto reasons = down_reasons(self, {echo.address(), linked.address()}, 5s);
    const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const auto& reason = reasons.at(echo.address());
    CHECK(reason.code() == errc::peer_lost);
    CHECK_THAT(reason.message(), Catch::Contains("worker1"));
    const auto& linked_reason = reasons.at(linked.address());
    CHECK(linked_reason.code() == errc::peer_lost);
    REQUIRE(open.wait_for(5s) == std::future_status::ready);
    auto [code, message] = open.get();
    CHECK(code == errc::peer_lost);
    CHECK_THAT(message, Catch::Contains("worker1"));
    const auto t1 = std::chrono::steady_clock::now();
    std::string later;
    CHECK(code_of([&] {
      caf::scoped_actor asker{sys};
      caf::error err;
      asker->request(echo, std::chrono::seconds(10), std::int32_t{1}).receive([](std::int32_t) {}, [&](caf::error& e) { err = e; });
      if (err) throw as_error(err);
    }, &later) == errc::peer_lost);
    CHECK(std::chrono::steady_clock::now() - t1 < 1s);
    WARN("SIGKILL -> down_msg: " << ms << " ms");
    CHECK(ms < 2000);
  }
  CHECK_THROWS_AS(children.join(10s), troupe::error);
}

TEST_CASE("a frozen process (SIGSTOP) sends down_msg with peer_lost to monitors within the heartbeat bound", "[actors][integration]") {
  port_pipe pipe;
  auto children = troupe::spawn(1, [&](int) { actor_child(pipe); });
  troupe::node n(actor_options(0, 2, 0));
  pipe.publish(n.port(), 1);
  auto& sys = n.system();
  {
    auto echo = troupe::lookup_actor(n, "worker1", "echo", 10s);
    caf::scoped_actor self{sys};
    self->monitor(echo);
    self->request(echo, 5s, std::int32_t{1}).receive([](std::int32_t) {}, [](caf::error&) {});
    const auto t0 = std::chrono::steady_clock::now();
    children.kill(0, SIGSTOP);
    auto reason = down_reason(self, echo.address(), 10s);
    const auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    CHECK(reason.code() == errc::peer_lost);
    CHECK_THAT(reason.message(), Catch::Contains("worker1"));
    WARN("SIGSTOP -> down_msg: " << ms << " ms");
    CHECK(ms < 5000);
  }
  children.kill(0, SIGKILL);
  CHECK_THROWS_AS(children.join(10s), troupe::error);
}
