// Supervisors in one process (Note [supervisor restart]): strategies, restart types, intensity,
// nesting and the errors of bad specs. Events are synchronised on, never slept for.
#include <caf/all.hpp>

#include <catch2/catch.hpp>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "troupe/actors/error_caf.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/remote_actor.hpp"
#include "troupe/actors/spawn_service.hpp"
#include "troupe/actors/supervisor.hpp"

using namespace std::chrono_literals;
using troupe::errc;

namespace {

using crash_atom = caf::atom_constant<caf::atom("crash")>;
using finish_atom = caf::atom_constant<caf::atom("finish")>;

// Lines in the order they happen, from any thread; waits are bounded.
class event_log {
 public:
  void push(std::string s) {
    std::lock_guard<std::mutex> lock(mu_);
    lines_.push_back(std::move(s));
    cv_.notify_all();
  }
  // Waits until `line` has been logged `times` times; the log then.
  std::vector<std::string> wait_for(const std::string& line, int times = 1, std::chrono::milliseconds bound = 20s) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, bound, [&] { return std::count(lines_.begin(), lines_.end(), line) >= times; });
    return lines_;
  }
  std::size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_.size();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
};

// A child that crashes on `crash`, exits normally on `finish`, and logs "~name" when stopped.
troupe::child_factory child_named(std::string name, event_log& log) {
  return [name, &log](troupe::node& n) {
    return n.system().spawn([name, &log](caf::event_based_actor* self) -> caf::behavior {
      self->set_exit_handler([self, name, &log](caf::exit_msg& m) {
        log.push("~" + name);
        self->quit(m.reason);
      });
      return {[self](crash_atom) { self->quit(troupe::to_caf_error(errc::remote_exception, "child crashed on request")); },
              [self](finish_atom) { self->quit(); }};
    });
  };
}

troupe::node_options solo() {
  troupe::node_options o;
  o.job_token = "t";
  o.default_timeout = 5s;
  return o;
}

std::vector<std::string> tail(const std::vector<std::string>& v, std::size_t from) { return {v.begin() + static_cast<std::ptrdiff_t>(from), v.end()}; }

// A node with a spawn service of children a, b, c, d and an event log.
struct fixture {
  event_log log;  // outlives the node: children log until they exit
  troupe::node n{solo()};
  troupe::spawn_service spawner{n, {{"a", child_named("a", log)}, {"b", child_named("b", log)}, {"c", child_named("c", log)}, {"d", child_named("d", log)}}};

  troupe::supervisor_options options(troupe::restart_strategy s, const std::vector<std::string>& names) {
    troupe::supervisor_options o;
    o.strategy = s;
    o.max_restarts = 10;
    o.period = 60s;
    for (const auto& c : names) o.children.push_back({c, c, {}, troupe::restart_type::permanent});
    o.on_event = [this](const troupe::supervisor_event& e) {
      using k = troupe::supervisor_event::kind_type;
      const char* mark = e.kind == k::started ? "+" : e.kind == k::stopped ? "-" : e.kind == k::exited ? "!" : e.kind == k::start_failed ? "?" : "x";
      log.push(mark + e.child);
    };
    return o;
  }
  caf::actor child(const std::string& name) { return troupe::lookup_actor(n, n.info().name, name, 5s); }
  // The supervisor's exit reason, as a troupe error (timeout when it did not exit).
  troupe::error wait_exit(caf::scoped_actor& self, const caf::actor& sup) {
    troupe::error out(errc::timeout, "the supervisor did not exit");
    self->receive([&](const caf::down_msg& d) { out = troupe::from_caf_error(d.reason, "supervisor"); }, caf::after(20s) >> [] {});
    (void)sup;
    return out;
  }
  troupe::error stop(const caf::actor& sup) {
    caf::scoped_actor self{n.system()};
    self->monitor(sup);
    self->send_exit(sup, caf::exit_reason::user_shutdown);
    return wait_exit(self, sup);
  }
};

// Crashes child `name` of a supervisor with children a, b, c under `s`; the log after the
// crashed child's restart.
std::vector<std::string> crash_b(troupe::restart_strategy s, fixture& f) {
  auto sup = troupe::spawn_supervisor(f.n, f.options(s, {"a", "b", "c"}));
  f.log.wait_for("+c");
  const auto before = f.log.size();
  auto old = f.child("b");
  caf::anon_send(old, crash_atom::value);
  auto lines = tail(f.log.wait_for("+c", 2), before);
  CHECK(f.child("b") != old);  // the new incarnation is published under the name
  f.stop(sup);
  return lines;
}

}  // namespace

TEST_CASE("one_for_one restarts only the failed child", "[actors][supervisor]") {
  fixture f;
  auto sup = troupe::spawn_supervisor(f.n, f.options(troupe::restart_strategy::one_for_one, {"a", "b", "c"}));
  CHECK(f.log.wait_for("+c") == std::vector<std::string>{"+a", "+b", "+c"});
  auto old = f.child("b");
  caf::anon_send(old, crash_atom::value);
  CHECK(tail(f.log.wait_for("+b", 2), 3) == std::vector<std::string>{"!b", "+b"});
  auto now = f.child("b");
  CHECK(now != old);
  CHECK(f.child("a") != nullptr);
  f.stop(sup);
  CHECK(tail(f.log.wait_for("-a"), 5) == std::vector<std::string>{"~c", "-c", "~b", "-b", "~a", "-a"});
}

TEST_CASE("rest_for_one restarts the failed child and those started after it, in order", "[actors][supervisor]") {
  fixture f;
  CHECK(crash_b(troupe::restart_strategy::rest_for_one, f) == std::vector<std::string>{"!b", "~c", "-c", "+b", "+c"});
}

TEST_CASE("one_for_all stops the others in reverse start order and restarts all in order", "[actors][supervisor]") {
  fixture f;
  CHECK(crash_b(troupe::restart_strategy::one_for_all, f) == std::vector<std::string>{"!b", "~c", "-c", "~a", "-a", "+a", "+b", "+c"});
}

TEST_CASE("a supervisor past its restart intensity stops its children in reverse order and exits naming the child and the cause",
          "[actors][supervisor]") {
  fixture f;
  auto o = f.options(troupe::restart_strategy::one_for_one, {"a", "b", "c"});
  o.max_restarts = 1;
  o.name = "top";
  auto sup = troupe::spawn_supervisor(f.n, o);
  caf::scoped_actor self{f.n.system()};
  self->monitor(sup);
  f.log.wait_for("+c");
  caf::anon_send(f.child("a"), crash_atom::value);
  f.log.wait_for("+a", 2);
  const auto before = f.log.size();
  caf::anon_send(f.child("a"), crash_atom::value);
  auto reason = f.wait_exit(self, sup);
  CHECK(reason.code() == errc::remote_exception);
  CHECK_THAT(reason.message(), Catch::Contains("'top'") && Catch::Contains("child 'a'") && Catch::Contains("child crashed on request") &&
                                   Catch::Contains("restart intensity"));
  CHECK(tail(f.log.wait_for("xa"), before) == std::vector<std::string>{"!a", "~c", "-c", "~b", "-b", "xa"});
}

TEST_CASE("restarts older than the period no longer count against the restart intensity", "[actors][supervisor]") {
  // At most 1 restart in 300 ms: a second crash well after the first restart is restarted, where
  // a count over all time would make the supervisor give up.
  fixture f;
  auto o = f.options(troupe::restart_strategy::one_for_one, {"a"});
  o.max_restarts = 1;
  o.period = 300ms;
  auto sup = troupe::spawn_supervisor(f.n, o);
  f.log.wait_for("+a");
  caf::anon_send(f.child("a"), crash_atom::value);
  f.log.wait_for("+a", 2);  // the first restart was recorded before this line was logged
  std::this_thread::sleep_for(400ms);  // the period passes: the behaviour under test, not a synchronisation
  caf::anon_send(f.child("a"), crash_atom::value);
  const auto lines = f.log.wait_for("+a", 3);
  CHECK(std::count(lines.begin(), lines.end(), "+a") == 3);
  CHECK(std::count(lines.begin(), lines.end(), "xa") == 0);
  f.stop(sup);
}

TEST_CASE("restart types: permanent children always restart, transient ones only after a crash, temporary ones never",
          "[actors][supervisor]") {
  fixture f;
  auto o = f.options(troupe::restart_strategy::one_for_one, {"a", "b", "c", "d"});
  o.children[1].restart = troupe::restart_type::transient;
  o.children[2].restart = troupe::restart_type::temporary;
  o.children[3].restart = troupe::restart_type::transient;
  auto sup = troupe::spawn_supervisor(f.n, o);
  f.log.wait_for("+d");
  caf::anon_send(f.child("a"), finish_atom::value);   // permanent, normal exit: restarted
  f.log.wait_for("+a", 2);
  caf::anon_send(f.child("b"), finish_atom::value);   // transient, normal exit: not restarted
  caf::anon_send(f.child("c"), crash_atom::value);    // temporary, crash: not restarted
  caf::anon_send(f.child("d"), crash_atom::value);    // transient, crash: restarted
  auto lines = f.log.wait_for("+d", 2);
  f.log.wait_for("!b");
  lines = f.log.wait_for("!c");
  CHECK(std::count(lines.begin(), lines.end(), "+b") == 1);
  CHECK(std::count(lines.begin(), lines.end(), "+c") == 1);
  f.stop(sup);
  // Only the running children stop: a, then d, in reverse order.
  lines = f.log.wait_for("-a");
  CHECK(std::count(lines.begin(), lines.end(), "-b") == 0);
  CHECK(std::count(lines.begin(), lines.end(), "-c") == 0);
  CHECK(std::find(lines.begin(), lines.end(), "-d") < std::find(lines.begin(), lines.end(), "-a"));
}

TEST_CASE("a nested supervisor's failure reaches its parent, which gives up naming both", "[actors][supervisor]") {
  event_log log;
  troupe::node n{solo()};
  troupe::supervisor_options inner;
  inner.name = "inner";
  inner.max_restarts = 0;
  inner.children = {{"leaf", "leaf", {}, troupe::restart_type::permanent}};
  inner.on_event = [&](const troupe::supervisor_event& e) {
    if (e.kind == troupe::supervisor_event::kind_type::started) log.push("+" + e.child);
  };
  troupe::spawn_service spawner{n, {{"leaf", child_named("leaf", log)}, {"inner", [inner](troupe::node& n) { return troupe::spawn_supervisor(n, inner); }}}};
  troupe::supervisor_options outer;
  outer.name = "outer";
  outer.max_restarts = 1;
  outer.children = {{"inner_sup", "inner", {}, troupe::restart_type::permanent}};
  outer.on_event = [&](const troupe::supervisor_event& e) {
    if (e.kind == troupe::supervisor_event::kind_type::started) log.push("+" + e.child);
  };
  auto sup = troupe::spawn_supervisor(n, outer);
  caf::scoped_actor self{n.system()};
  self->monitor(sup);
  log.wait_for("+leaf");
  log.wait_for("+inner_sup");
  caf::anon_send(troupe::lookup_actor(n, n.info().name, "leaf", 5s), crash_atom::value);
  log.wait_for("+leaf", 2);  // the outer supervisor restarted the inner one, which started a new leaf
  // The outer one has the new inner one in hand (published and looked up) before its leaf
  // crashes; a crash earlier would be a failed start instead.
  log.wait_for("+inner_sup", 2);
  caf::anon_send(troupe::lookup_actor(n, n.info().name, "leaf", 5s), crash_atom::value);
  troupe::error reason(errc::timeout, "the outer supervisor did not exit");
  self->receive([&](const caf::down_msg& d) { reason = troupe::from_caf_error(d.reason, "outer"); }, caf::after(20s) >> [] {});
  CHECK(reason.code() == errc::remote_exception);
  CHECK_THAT(reason.message(), Catch::Contains("'outer'") && Catch::Contains("child 'inner_sup'") && Catch::Contains("'inner'") &&
                                   Catch::Contains("child 'leaf'") && Catch::Contains("child crashed on request"));
}

TEST_CASE("bad child specs get errors naming what was wrong", "[actors][supervisor]") {
  fixture f;
  auto o = f.options(troupe::restart_strategy::one_for_one, {"a", "b", "a"});
  std::string message;
  try {
    troupe::spawn_supervisor(f.n, o);
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::bad_argument);
    message = e.message();
  }
  CHECK_THAT(message, Catch::Contains("duplicate child name 'a'"));
  o = f.options(troupe::restart_strategy::one_for_one, {"a"});
  o.children[0].workers = {"worker7"};
  message.clear();
  try {
    troupe::spawn_supervisor(f.n, o);
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::bad_argument);
    message = e.message();
  }
  CHECK_THAT(message, Catch::Contains("worker7") && Catch::Contains("child 'a'"));
  o = f.options(troupe::restart_strategy::one_for_one, {"a"});
  o.children[0].factory = "no_such_factory";
  o.max_restarts = 1;  // one retry, then it gives up
  auto sup = troupe::spawn_supervisor(f.n, o);
  caf::scoped_actor self{f.n.system()};
  self->monitor(sup);
  auto reason = f.wait_exit(self, sup);
  CHECK(reason.code() == errc::unknown_function);
  CHECK_THAT(reason.message(), Catch::Contains("no_such_factory") && Catch::Contains("child 'a'"));
}

namespace {

// A factory that throws its first `failures` calls, then makes a child_named(name).
troupe::child_factory failing_first(std::string name, event_log& log, std::shared_ptr<std::atomic<int>> calls, int failures) {
  return [name, &log, calls, failures](troupe::node& n) -> caf::actor {
    if (++*calls <= failures) throw troupe::error(errc::invalid_state, "factory of " + name + " not ready (call " + std::to_string(calls->load()) + ")");
    return child_named(name, log)(n);
  };
}

}  // namespace

TEST_CASE("a failed start is retried after a backoff and the children after it start once it ran", "[actors][supervisor]") {
  fixture f;
  auto calls = std::make_shared<std::atomic<int>>(0);
  troupe::spawn_service flaky{f.n, {{"flaky", failing_first("flaky", f.log, calls, 2)}}};
  // The service published last on a worker serves its starts: this one, with only "flaky".
  auto o = f.options(troupe::restart_strategy::one_for_one, {"flaky"});
  o.start_backoff = 10ms;
  o.max_restarts = 3;
  auto sup = troupe::spawn_supervisor(f.n, o);
  const auto lines = f.log.wait_for("+flaky");
  CHECK(lines == std::vector<std::string>{"?flaky", "?flaky", "+flaky"});
  CHECK(calls->load() == 3);
  f.stop(sup);
}

TEST_CASE("failed starts count against the restart intensity; past it the supervisor exits naming the child, the cause and the count",
          "[actors][supervisor]") {
  fixture f;
  auto calls = std::make_shared<std::atomic<int>>(0);
  troupe::spawn_service flaky{f.n, {{"flaky", failing_first("flaky", f.log, calls, 1000)}}};  // never starts
  auto o = f.options(troupe::restart_strategy::one_for_one, {"flaky"});
  o.name = "top";
  o.start_backoff = 5ms;
  o.max_restarts = 2;
  auto sup = troupe::spawn_supervisor(f.n, o);
  caf::scoped_actor self{f.n.system()};
  self->monitor(sup);
  auto reason = f.wait_exit(self, sup);
  CHECK(reason.code() == errc::invalid_state);
  CHECK_THAT(reason.message(), Catch::Contains("'top'") && Catch::Contains("child 'flaky'") && Catch::Contains("not ready (call 3)") &&
                                   Catch::Contains("3 failed starts"));
  CHECK(f.log.wait_for("xflaky") == std::vector<std::string>{"?flaky", "?flaky", "?flaky", "xflaky"});
  CHECK(calls->load() == 3);
}

TEST_CASE("a child that exits before the supervisor looked it up is a crash and is restarted, not a failed start", "[actors][supervisor]") {
  fixture f;
  auto calls = std::make_shared<std::atomic<int>>(0);
  // The first incarnation is dead before the factory returns, so before any lookup.
  troupe::child_factory dies_first = [&log = f.log, calls](troupe::node& n) -> caf::actor {
    auto child = child_named("a", log)(n);
    if (++*calls > 1) return child;
    caf::scoped_actor waiter{n.system()};
    waiter->monitor(child);
    waiter->send_exit(child, troupe::to_caf_error(errc::remote_exception, "died at once"));
    bool down = false;
    waiter->receive([&](const caf::down_msg&) { down = true; }, caf::after(5s) >> [] {});
    if (!down) throw troupe::error(errc::timeout, "the first incarnation did not exit");
    return child;
  };
  troupe::spawn_service early{f.n, {{"a", dies_first}}};
  auto o = f.options(troupe::restart_strategy::one_for_one, {"a"});
  std::string cause;
  std::mutex mu;
  auto log_event = o.on_event;
  o.on_event = [&, log_event](const troupe::supervisor_event& e) {
    if (e.kind == troupe::supervisor_event::kind_type::exited) {
      std::lock_guard<std::mutex> lock(mu);
      cause = e.cause;
    }
    log_event(e);
  };
  auto sup = troupe::spawn_supervisor(f.n, o);
  CHECK(f.log.wait_for("+a", 2) == std::vector<std::string>{"~a", "+a", "!a", "+a"});
  {
    std::lock_guard<std::mutex> lock(mu);
    CHECK_THAT(cause, Catch::Contains("exited before the supervisor looked it up"));
  }
  CHECK(calls->load() == 2);
  f.stop(sup);
}

TEST_CASE("a negative start_backoff is refused", "[actors][supervisor]") {
  fixture f;
  auto o = f.options(troupe::restart_strategy::one_for_one, {"a"});
  o.start_backoff = -1ms;
  CHECK_THROWS_WITH(troupe::spawn_supervisor(f.n, o), Catch::Contains("start_backoff"));
}
