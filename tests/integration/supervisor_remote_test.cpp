// Supervisors across processes (Note [supervisor restart]). A child on a SIGKILLed process is
// restarted on the next live worker of its spec, and found there by lookup. A child that may
// only live on the dead worker makes its supervisor give up naming the child and the worker.
// A child that exits on a live remote worker makes one_for_all stop and start the children on
// both workers, and each is found there again under its name.
#include <signal.h>

#include <condition_variable>
#include <mutex>

#include <catch2/catch.hpp>

#include "integration/actor_child.hpp"
#include "troupe/actors/spawn.hpp"
#include "troupe/actors/spawn_service.hpp"
#include "troupe/actors/supervisor.hpp"

using namespace std::chrono_literals;
using namespace troupe::test;
using troupe::errc;

namespace {

// Ranks 1 and 2: a spawn service with an "echo" factory, until rank 0 sets "done".
void hosting_child(port_pipe& pipe, int rank) {
  troupe::node n(actor_options(rank, 3, pipe.read()));
  {
    troupe::spawn_service spawner(n, {{"echo", [](troupe::node& n) { return n.system().spawn(echo_actor); }}});
    n.store().set("ready/" + std::to_string(rank), "1");
    n.store().get("done", std::chrono::seconds(120));
  }
  n.shutdown(troupe::shutdown_mode::graceful, std::chrono::seconds(10));
}

// Started workers and exits of one supervisor's children, in order; waits are bounded.
struct started_log {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> started;  // "child@worker"
  std::vector<std::string> events;   // "+child@worker" started, "!child" exited, "-child" stopped
  troupe::supervisor_options options(std::string name, std::string child, std::vector<std::string> workers) {
    troupe::supervisor_options o;
    o.name = std::move(name);
    o.spawn_timeout = 5s;
    o.children = {{std::move(child), "echo", std::move(workers), troupe::restart_type::permanent}};
    o.on_event = [this](const troupe::supervisor_event& e) {
      using k = troupe::supervisor_event::kind_type;
      std::lock_guard<std::mutex> lock(mu);
      if (e.kind == k::stopped || e.kind == k::exited) events.push_back((e.kind == k::stopped ? "-" : "!") + e.child);
      if (e.kind != k::started) return;
      started.push_back(e.child + "@" + e.worker);
      events.push_back("+" + e.child + "@" + e.worker);
      cv.notify_all();
    };
    return o;
  }
  std::vector<std::string> wait(std::size_t n, std::chrono::milliseconds bound = 20s) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, bound, [&] { return started.size() >= n; });
    return started;
  }
};

/// Rank 0 of three: workers 1 and 2 host children (hosting_child) and are ready.
struct hosting_job {
  hosting_job() : children(troupe::spawn(2, [this](int i) { hosting_child(pipe, i + 1); })), n(actor_options(0, 3, 0)) {
    pipe.publish(n.port(), 2);
    n.store().get("ready/1", 20s);
    n.store().get("ready/2", 20s);
  }
  port_pipe pipe;
  troupe::spawn_context children;
  troupe::node n;
};

}  // namespace

TEST_CASE("a child on a SIGKILLed process restarts on the next live worker and lookup finds it there; a pinned one is reported",
          "[actors][integration][supervisor]") {
  hosting_job job;
  auto& n = job.n;
  auto& children = job.children;
  started_log mobile_log, pinned_log;
  auto mobile = troupe::spawn_supervisor(n, mobile_log.options("mobile_sup", "mobile", {"worker1", "worker2"}));
  auto pinned = troupe::spawn_supervisor(n, pinned_log.options("pinned_sup", "pinned", {"worker1"}));
  CHECK(mobile_log.wait(1) == std::vector<std::string>{"mobile@worker1"});
  CHECK(pinned_log.wait(1) == std::vector<std::string>{"pinned@worker1"});
  caf::scoped_actor self{n.system()};
  self->monitor(pinned);
  {
    auto first = troupe::lookup_actor(n, "worker1", "mobile", 5s);
    self->request(first, 5s, std::int32_t{1}).receive([](std::int32_t x) { CHECK(x == 2); }, [](caf::error& e) { FAIL(caf::to_string(e)); });
  }
  children.kill(0, SIGKILL);
  CHECK(mobile_log.wait(2) == std::vector<std::string>{"mobile@worker1", "mobile@worker2"});
  auto again = troupe::lookup_actor(n, "worker2", "mobile", 5s);
  std::int32_t answer = 0;
  self->request(again, 5s, std::int32_t{41}).receive([&](std::int32_t x) { answer = x; }, [](caf::error& e) { FAIL(caf::to_string(e)); });
  CHECK(answer == 42);
  troupe::error reason(errc::timeout, "the pinned supervisor did not exit");
  self->receive([&](const caf::down_msg& d) { reason = as_error(d.reason); }, caf::after(30s) >> [] {});
  CHECK(reason.code() == errc::peer_lost);
  CHECK_THAT(reason.message(), Catch::Contains("'pinned_sup'") && Catch::Contains("child 'pinned'") && Catch::Contains("worker1"));
  self->monitor(mobile);
  self->send_exit(mobile, caf::exit_reason::user_shutdown);
  bool mobile_down = false;
  self->receive([&](const caf::down_msg& d) { mobile_down = d.source == mobile.address(); }, caf::after(20s) >> [] {});
  CHECK(mobile_down);
  n.store().set("done", "1");
  CHECK_THROWS_AS(children.join(30s), troupe::error);  // rank 1 was killed
}

TEST_CASE("one_for_all across two workers restarts both children when one exits on its live worker, and lookup finds each new one",
          "[actors][integration][supervisor]") {
  hosting_job job;
  auto& n = job.n;
  auto& children = job.children;
  started_log log;
  auto o = log.options("pair_sup", "left", {"worker1"});
  o.strategy = troupe::restart_strategy::one_for_all;
  o.children.push_back({"right", "echo", {"worker2"}, troupe::restart_type::permanent});
  auto sup = troupe::spawn_supervisor(n, o);
  REQUIRE(log.wait(2) == std::vector<std::string>{"left@worker1", "right@worker2"});
  {
    caf::scoped_actor self{n.system()};
    auto ask = [&](const caf::actor& a, std::int32_t x) {
      std::int32_t y = 0;
      self->request(a, 5s, x).receive([&](std::int32_t r) { y = r; }, [](caf::error& e) { FAIL(caf::to_string(e)); });
      return y;
    };
    const auto left = troupe::lookup_actor(n, "worker1", "left", 5s), right = troupe::lookup_actor(n, "worker2", "right", 5s);
    CHECK(ask(left, 1) == 2);
    // The right child exits normally on its worker, which lives on: the supervisor sees it
    // through its remote monitor; permanent children restart after any exit.
    self->request(right, 5s, quit_atom::value).receive([](std::int32_t) {}, [](caf::error&) {});
    REQUIRE(log.wait(4).size() == 4);
    {
      std::lock_guard<std::mutex> lock(log.mu);
      CHECK(log.events == std::vector<std::string>{"+left@worker1", "+right@worker2", "!right", "-left", "+left@worker1", "+right@worker2"});
    }
    const auto left2 = troupe::lookup_actor(n, "worker1", "left", 5s), right2 = troupe::lookup_actor(n, "worker2", "right", 5s);
    CHECK(left2 != left);
    CHECK(right2 != right);
    CHECK(ask(left2, 10) == 11);
    CHECK(ask(right2, 20) == 21);
    self->monitor(sup);
    self->send_exit(sup, caf::exit_reason::user_shutdown);
    bool down = false;
    self->receive([&](const caf::down_msg& d) { down = d.source == sup.address(); }, caf::after(20s) >> [] {});
    CHECK(down);
  }
  sup = nullptr;  // a handle of the detached supervisor would hold up the actor system's end
  release_children(n);  // every rank leaves gracefully together
  CHECK(children.join(30s));
}
