// Hang blame for slow RPCs (Note [rpc blame]). A call waiting past blame_after gets a report
// naming the caller, the callee, the function and where the callee is. A call that then times
// out carries it in its error. One node calling itself: the callee's recorder is its own.
#include <signal.h>

#include <catch2/catch.hpp>

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "integration/node_harness.hpp"
#include "troupe/actors/fault_plan.hpp"
#include "troupe/actors/node.hpp"
#include "troupe/actors/rpc/api.hpp"
#include "troupe/actors/spawn.hpp"

using namespace std::chrono_literals;
using troupe::errc;

namespace {

// Reports and a gate that holds the slow function, both waited on with a bound.
struct blame_log {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> reports;
  bool open = false;

  void push(const std::string& s) {
    std::lock_guard<std::mutex> lock(mu);
    reports.push_back(s);
    cv.notify_all();
  }
  std::string first_report(std::chrono::milliseconds bound = 10s) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, bound, [&] { return !reports.empty(); });
    return reports.empty() ? std::string("(no report)") : reports.front();
  }
  void release() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
  // The slow function's body: returns once released (or after the bound).
  int hold() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, 10s, [&] { return open; });
    return 1;
  }
};

troupe::node_options blamed(blame_log& log) {
  troupe::node_options o;
  o.job_token = "t";
  o.default_timeout = 5s;
  o.blame_after = 200ms;
  o.on_blame = [&log](const std::string& s) { log.push(s); };
  return o;
}

}  // namespace

TEST_CASE("a call waiting past blame_after is reported with its caller, callee, function and the callee running it", "[fault][blame]") {
  blame_log log;
  troupe::node n(blamed(log));
  n.functions().add("slow", [&log] { return log.hold(); });
  auto f = troupe::rpc_async<int>(n, "worker0", "slow", 5s);
  const std::string report = log.first_report();
  log.release();
  INFO(report);
  CHECK_THAT(report, Catch::Contains("worker0 called 'slow' on worker0 (call #") && Catch::Contains("has waited") &&
                         Catch::Contains("worker0 is running 'slow' for worker0"));
  CHECK(f.get() == 1);
  n.shutdown(troupe::shutdown_mode::immediate);
}

TEST_CASE("a call that times out after blame_after carries the report in its error", "[fault][blame]") {
  blame_log log;
  troupe::node n(blamed(log));
  n.functions().add("slow", [&log] { return log.hold(); });
  auto f = troupe::rpc_async<int>(n, "worker0", "slow", 4s);  // the report comes at about 0.5 s
  const std::string report = log.first_report();
  std::string message;
  try {
    f.get();
  } catch (const troupe::error& e) {
    CHECK(e.code() == errc::timeout);
    message = e.message();
  }
  log.release();
  INFO(message);
  CHECK_THAT(report, Catch::Contains("is running 'slow'"));
  CHECK_THAT(message, Catch::Contains("no answer by the deadline") && Catch::Contains("worker0 called 'slow' on worker0") &&
                          Catch::Contains("worker0 is running 'slow' for worker0"));
  n.shutdown(troupe::shutdown_mode::immediate);
}

TEST_CASE("a call the callee never received is reported as having no record there", "[fault][blame]") {
  blame_log log;
  auto inj = std::make_shared<troupe::fault_injector>(troupe::fault_plan::parse("rule lost fail_first=1\n"));
  troupe::node n(blamed(log), {}, inj);
  n.functions().add("lost", [] { return 2; });
  auto f = troupe::rpc_async<int>(n, "worker0", "lost", 2s);
  const std::string report = log.first_report();
  INFO(report);
  CHECK_THAT(report, Catch::Contains("called 'lost' on worker0") && Catch::Contains("is not running 'lost' for worker0") &&
                         Catch::Contains("no record of it"));
  CHECK_THROWS_WITH(f.get(), Catch::Contains("no record of it"));
  n.shutdown(troupe::shutdown_mode::immediate);
}

namespace {

// Whether `rec` shows an open question to a callee (Note [rpc blame]), waited for up to `bound`.
bool asking(const troupe::flight_recorder& rec, std::chrono::milliseconds bound) {
  const auto until = std::chrono::steady_clock::now() + bound;
  for (;;) {
    for (const auto& e : rec.last())
      if (e.kind == troupe::trace_kind::rpc_call && e.name == "troupe.blame.where" && !e.ended) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(5ms);  // polls a condition, bounded
  }
}

}  // namespace

TEST_CASE("a call whose callee process is killed while it is asked where it is gets a report naming the callee lost", "[fault][blame]") {
  troupe::test::port_pipe pipe;
  auto child = troupe::spawn(1, [&pipe](int) {
    troupe::node n(troupe::test::test_options(1, 2, pipe.read()));
    n.functions().add("hold", [&n] {
      n.store().set("running", "1");
      n.store().get("never", 30s);  // the process is stopped, then killed, before this ends
      return 1;
    });
    n.store().set("pid", std::to_string(::getpid()));
    n.store().get("done", 60s);
  });
  blame_log log;
  auto o = troupe::test::test_options(0, 2, 0);
  o.blame_after = 300ms;
  o.on_blame = [&log](const std::string& s) { log.push(s); };
  troupe::node n(o);
  pipe.publish(n.port(), 1);
  const pid_t callee = static_cast<pid_t>(std::stol(n.store().get("pid", 20s)));
  auto f = troupe::rpc_async<int>(n, "worker1", "hold", 10s);
  n.store().get("running", 10s);  // the call is in flight, well within blame_after
  REQUIRE(::kill(callee, SIGSTOP) == 0);  // it cannot answer where it is
  const bool asked = asking(n.recorder(), 5s);
  ::kill(callee, SIGKILL);
  REQUIRE(asked);
  const std::string report = log.first_report();
  INFO(report);
  CHECK_THAT(report, Catch::Contains("worker0 called 'hold' on worker1") && Catch::Contains("worker1 is lost"));
  CHECK_THROWS_WITH(f.get(), Catch::Contains("worker1"));
  CHECK_THROWS(child.join(10s));  // the killed child is reaped and named
  n.shutdown(troupe::shutdown_mode::immediate);
}

TEST_CASE("without blame_after no call is reported", "[fault][blame]") {
  blame_log log;
  auto o = blamed(log);
  o.blame_after = 0ms;
  troupe::node n(o);
  n.functions().add("slow", [&log] { return log.hold(); });
  auto f = troupe::rpc_async<int>(n, "worker0", "slow", 600ms);
  CHECK_THROWS_WITH(f.get(), !Catch::Contains("called 'slow'"));
  log.release();
  CHECK(log.first_report(0ms) == "(no report)");
  n.shutdown(troupe::shutdown_mode::immediate);
}
